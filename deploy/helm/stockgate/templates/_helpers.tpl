{{- define "stockgate.fullname" -}}
{{- if contains "stockgate" .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}{{- else -}}{{ printf "%s-stockgate" .Release.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "stockgate.selector" -}}
app.kubernetes.io/name: stockgate
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "stockgate.labels" -}}
{{ include "stockgate.selector" . }}
app.kubernetes.io/part-of: stockgate
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "stockgate.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "stockgate.secretName" -}}
{{ .Values.existingSecret | default (include "stockgate.fullname" .) }}
{{- end -}}

{{- /* The container's environment: the ConfigMap and the Secret. */ -}}
{{- define "stockgate.envFrom" -}}
- configMapRef:
    name: {{ include "stockgate.fullname" . }}
{{- if or .Values.existingSecret .Values.secretEnv }}
- secretRef:
    name: {{ include "stockgate.secretName" . }}
{{- end }}
{{- end -}}

{{- /* The admin listener's port when STOCKGATE_ADMIN_ADDR is set, else "". */ -}}
{{- define "stockgate.adminPort" -}}
{{- with .Values.env.STOCKGATE_ADMIN_ADDR }}{{ splitList ":" . | last }}{{ end -}}
{{- end -}}
