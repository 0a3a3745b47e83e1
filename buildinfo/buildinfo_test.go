package buildinfo

import (
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestBuildInfoMetric(t *testing.T) {
	in := Read()
	if in.GoVersion != runtime.Version() || in.Version == "" {
		t.Fatalf("Read() = %+v, want this binary's Go version and a version", in)
	}
	if !strings.Contains(in.String(), in.GoVersion) {
		t.Errorf("String() = %q", in.String())
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(Collector())
	want := `# HELP stockgate_build_info The running build: version, VCS revision and Go version, as labels; always 1.
# TYPE stockgate_build_info gauge
stockgate_build_info{goversion="` + in.GoVersion + `",modified="` + map[bool]string{true: "true", false: "false"}[in.Modified] +
		`",revision="` + in.Revision + `",version="` + in.Version + `"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "stockgate_build_info"); err != nil {
		t.Error(err)
	}
}
