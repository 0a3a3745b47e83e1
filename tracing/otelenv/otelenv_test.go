package otelenv_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stockgate/stockgate/tracing"
	"github.com/stockgate/stockgate/tracing/otelenv"
)

// The OTEL_* variables decide: nothing set is off (not the specification's
// default of otlp), an endpoint alone or the otlp exporter is on, none and
// OTEL_SDK_DISABLED are off, and what this build cannot export is an error
// that names it.
func TestSetupFromEnvironment(t *testing.T) {
	for _, c := range []struct {
		name string
		env  map[string]string
		on   bool
		err  error
	}{
		{"nothing set", nil, false, nil},
		{"endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true, nil},
		{"traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true, nil},
		{"otlp", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true, nil},
		{"none", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, false, nil},
		{"disabled", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, false, nil},
		{"zipkin", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, false, otelenv.ErrExporter},
		// What platforms inject (the OpenTelemetry Operator, collectors'
		// Helm charts): gRPC, for every signal or for traces alone.
		{"grpc", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, true, nil},
		{"grpc endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, true, nil},
		{"traces grpc", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, true, nil},
		{"http/protobuf", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, true, nil},
		{"http/json", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, false, otelenv.ErrExporter},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
				"OTEL_SDK_DISABLED", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
				t.Setenv(k, c.env[k])
			}
			shutdown, err := otelenv.Setup(context.Background())
			if !errors.Is(err, c.err) {
				t.Fatalf("Setup = %v, want %v", err, c.err)
			}
			if err != nil {
				return
			}
			if tracing.Enabled() != c.on {
				t.Errorf("enabled = %v, want %v", tracing.Enabled(), c.on)
			}
			if err := shutdown(context.Background()); err != nil {
				t.Errorf("shutdown: %v", err)
			}
			if tracing.Enabled() {
				t.Error("still on after shutdown")
			}
		})
	}
}

// Settings the SDK takes and then fails on are refused at start: an
// endpoint that is no http(s) URL (it exported to https://localhost:4318
// instead, saying so only in a log line), a negative queue or batch size
// (a panic at start), a schedule delay of 0 or less (a core busy for ever).
func TestSetupRefusesSettingsTheSDKFailsOn(t *testing.T) {
	for _, env := range []map[string]string{
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://[::1"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://collector/v1/traces"},
		{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_BSP_MAX_QUEUE_SIZE": "-1"},
		{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "-1"},
		{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_BSP_SCHEDULE_DELAY": "0"},
		{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_BSP_SCHEDULE_DELAY": "-5"},
	} {
		for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
			"OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "OTEL_BSP_SCHEDULE_DELAY"} {
			t.Setenv(k, env[k])
		}
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("Setup with %v panicked: %v", env, p)
				}
			}()
			shutdown, err := otelenv.Setup(context.Background())
			if err == nil {
				_ = shutdown(context.Background())
			}
			if !errors.Is(err, otelenv.ErrSetting) {
				t.Errorf("Setup with %v = %v, want ErrSetting", env, err)
			}
			for k, v := range env {
				if err != nil && k != "OTEL_TRACES_EXPORTER" && !strings.Contains(err.Error(), k) {
					t.Errorf("error %q does not name %s=%s", err, k, v)
				}
			}
		}()
	}
}
