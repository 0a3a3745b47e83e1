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

{{- /* The serving pods' labels: podLabels, under the chart's own (a
podLabels key never changes what the Service and the PDB select). */ -}}
{{- define "stockgate.podLabels" -}}
{{- toYaml (merge (fromYaml (include "stockgate.labels" .)) (deepCopy .Values.podLabels)) }}
{{- end -}}

{{- /* repository@digest when image.digest is set: the bytes that were
tested, whatever the tag is moved to since. */ -}}
{{- define "stockgate.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{- define "stockgate.secretName" -}}
{{ .Values.existingSecret | default (include "stockgate.fullname" .) }}
{{- end -}}

{{- define "stockgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{ .Values.serviceAccount.name | default (include "stockgate.fullname" .) }}
{{- else -}}
{{ .Values.serviceAccount.name | default "default" }}
{{- end -}}
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

{{- /* The gateway's port: STOCKGATE_ADDR's (the gateway's default, :8080,
when unset). The probes, the Service and the NetworkPolicy name it. */ -}}
{{- define "stockgate.port" -}}
{{- splitList ":" (.Values.env.STOCKGATE_ADDR | default ":8080") | last | default "8080" -}}
{{- end -}}

{{- /* The admin listener's port when STOCKGATE_ADMIN_ADDR is set, else "". */ -}}
{{- define "stockgate.adminPort" -}}
{{- with .Values.env.STOCKGATE_ADMIN_ADDR }}{{ splitList ":" . | last }}{{ end -}}
{{- end -}}

{{- /* Who owns the replica count: "keda" (preScale, with KEDA's CRDs in
the cluster: its ScaledObject makes the HPA), "hpa" (the chart's HPA:
autoscaling.enabled, or preScale on a cluster without KEDA, so the pods
still scale, on CPU, rather than stay at one), or "" (replicas). Never
two: two autoscalers of one Deployment fight over its size. */ -}}
{{- define "stockgate.scaler" -}}
{{- $keda := and .Values.preScale.enabled (.Capabilities.APIVersions.Has "keda.sh/v1alpha1") -}}
{{- if $keda -}}
{{- if .Values.autoscaling.prometheusAdapter -}}
{{- fail "autoscaling.prometheusAdapter adds requests per second to the chart's HPA, but with preScale.enabled KEDA makes the HPA (the chart renders none): set one of them false" -}}
{{- end -}}
keda
{{- else if or .Values.autoscaling.enabled .Values.preScale.enabled -}}
hpa
{{- end -}}
{{- end -}}

{{- /* How the autoscaler (the chart's HPA, or the one KEDA makes) moves:
on-sales start as a wall of traffic, so up at once, down slowly. */ -}}
{{- define "stockgate.scaleBehavior" -}}
scaleUp:
  stabilizationWindowSeconds: 0
  policies:
    - type: Percent
      value: 100
      periodSeconds: 15
scaleDown:
  stabilizationWindowSeconds: 300
{{- end -}}

{{- /* The fewest pods the Deployment runs: autoscaling.minReplicas when
autoscaled, else replicas. */ -}}
{{- define "stockgate.minReplicas" -}}
{{- if include "stockgate.scaler" . }}{{ .Values.autoscaling.minReplicas }}{{ else }}{{ .Values.replicas }}{{ end -}}
{{- end -}}

{{- /* Whether the environment sets NAME, or NAME_FILE (the file of a
Secret mounted with extraVolumes): in env, in secretEnv, by an extraEnv
entry (valueFrom a Secret of one's own), or, we trust, in existingSecret. */ -}}
{{- define "stockgate.hasEnv" -}}
{{- $root := index . 0 -}}
{{- $set := $root.Values.existingSecret -}}
{{- range $name := list (index . 1) (printf "%s_FILE" (index . 1)) -}}
{{- range $root.Values.extraEnv }}{{ if eq .name $name }}{{ $set = true }}{{ end }}{{ end -}}
{{- if or (index $root.Values.env $name) (index $root.Values.secretEnv $name) }}{{ $set = true }}{{ end -}}
{{- end -}}
{{- if $set }}true{{ end -}}
{{- end -}}

{{- /* The migration Job's secrets, as YAML {existingSecret, secretEnv}:
migration.existingSecret and migration.secretEnv when either is set (a
login of its own), else the pods'. */ -}}
{{- define "stockgate.migrationSecrets" -}}
{{- $m := .Values.migration -}}
{{- if or $m.existingSecret $m.secretEnv -}}
{{- toYaml (dict "existingSecret" ($m.existingSecret | default "") "secretEnv" ($m.secretEnv | default dict)) -}}
{{- else -}}
{{- toYaml (dict "existingSecret" .Values.existingSecret "secretEnv" .Values.secretEnv) -}}
{{- end -}}
{{- end -}}

{{- /* Refuse to render what cannot start. The gateway exits 2 at once
without an admin token on a network address or without a ledger DSN, and
a crash-looping Deployment says why only in its pods' logs: better that
helm install says it, naming the value to set.

Why not generate the token (randAlphaNum into a Secret, kept across
upgrades with lookup)? lookup answers nothing under helm template,
--dry-run and GitOps tools (Argo CD renders with helm template), so there
the token would change at every render, logging every admin client out;
and someone has to hand the token to the operators and the platform that
call the admin routes anyway. A DSN cannot be generated at all. */ -}}
{{- define "stockgate.validate" -}}
{{- $open := eq (toString (index .Values.env "STOCKGATE_ALLOW_OPEN_ADMIN")) "true" -}}
{{- if not (or $open (include "stockgate.hasEnv" (list . "STOCKGATE_ADMIN_TOKEN"))) -}}
{{- fail "\n\nstockgate needs an admin token, or its pods exit 2 at start (admin routes open to the network): set secretEnv.STOCKGATE_ADMIN_TOKEN (e.g. --set secretEnv.STOCKGATE_ADMIN_TOKEN=$(openssl rand -hex 24)), or existingSecret to a Secret holding STOCKGATE_ADMIN_TOKEN and STOCKGATE_LEDGER_DSN, or env.STOCKGATE_ADMIN_TOKEN_FILE to a file of a Secret mounted with extraVolumes (docs/OPERATIONS.md, \"Installing on Kubernetes\")." -}}
{{- end -}}
{{- $host := splitList ":" (.Values.env.STOCKGATE_ADDR | default ":8080") | first -}}
{{- if or (hasPrefix "127." $host) (eq $host "localhost") (eq $host "[::1]") -}}
{{- fail (printf "\n\nenv.STOCKGATE_ADDR %q listens on loopback only: the kubelet's probes and the Service cannot reach it; listen on every interface (\":8080\") and keep the admin routes apart with STOCKGATE_ADMIN_ADDR" .Values.env.STOCKGATE_ADDR) -}}
{{- end -}}
{{- /* Kubernetes kills the pod terminationGracePeriodSeconds after it
starts the preStop sleep: the sleep, the drain (STOCKGATE_SHUTDOWN_GRACE)
and the last flush of spans (5 s) must fit, or a slow drain is cut. */ -}}
{{- $grace := toString (.Values.env.STOCKGATE_SHUTDOWN_GRACE | default "20s") -}}
{{- if regexMatch "^[0-9]+s$" $grace -}}
{{- $need := add (int .Values.preStopSeconds) (atoi (trimSuffix "s" $grace)) 5 -}}
{{- if gt (int $need) (int .Values.terminationGracePeriodSeconds) -}}
{{- fail (printf "\n\nterminationGracePeriodSeconds %d is shorter than preStopSeconds (%d) + env.STOCKGATE_SHUTDOWN_GRACE (%s) + 5 s of span flush = %d s: Kubernetes would kill a pod mid-drain; raise terminationGracePeriodSeconds" (int .Values.terminationGracePeriodSeconds) (int .Values.preStopSeconds) $grace (int $need)) -}}
{{- end -}}
{{- end -}}
{{- if not (include "stockgate.hasEnv" (list . "STOCKGATE_LEDGER_DSN")) -}}
{{- fail "\n\nstockgate needs the ledger's DSN, or its pods exit 2 at start: set secretEnv.STOCKGATE_LEDGER_DSN (postgres://user:password@host:5432/db), or existingSecret to a Secret holding STOCKGATE_ADMIN_TOKEN and STOCKGATE_LEDGER_DSN, or env.STOCKGATE_LEDGER_DSN_FILE to a file of a Secret mounted with extraVolumes (docs/OPERATIONS.md, \"Installing on Kubernetes\")." -}}
{{- end -}}
{{- if and (has (toString .Values.rollout.maxSurge) (list "0" "0%")) (has (toString .Values.rollout.maxUnavailable) (list "0" "0%")) -}}
{{- fail "\n\nrollout.maxSurge and rollout.maxUnavailable are both 0: a rollout could neither add a pod nor take one away; raise maxSurge (e.g. 25%)" -}}
{{- end -}}
{{- /* A login of the Job's own must carry a DSN: it has none of the pods'. */ -}}
{{- $m := .Values.migration -}}
{{- if and $m.enabled $m.secretEnv (not $m.existingSecret) -}}
{{- $dsn := or (index $m.secretEnv "STOCKGATE_LEDGER_DSN") .Values.env.STOCKGATE_LEDGER_DSN_FILE -}}
{{- range ($m.extraEnv | default .Values.extraEnv) }}{{ if has .name (list "STOCKGATE_LEDGER_DSN" "STOCKGATE_LEDGER_DSN_FILE") }}{{ $dsn = true }}{{ end }}{{ end -}}
{{- if not $dsn -}}
{{- fail "\n\nmigration.secretEnv is the migration Job's own login, and carries no STOCKGATE_LEDGER_DSN (the Job has none of the pods' secrets then): set migration.secretEnv.STOCKGATE_LEDGER_DSN to the DSN of the role that may change the schema, or migration.existingSecret to a Secret holding it." -}}
{{- end -}}
{{- end -}}
{{- end -}}
