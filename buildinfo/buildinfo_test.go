package buildinfo

import (
	"runtime"
	"runtime/debug"
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

// What the build stamped, -X values first; a build that stamped nothing
// about its source says so rather than "(devel)" alone.
func TestRead(t *testing.T) {
	vcs := func(rev, time, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.time", Value: time}, {Key: "vcs.modified", Value: modified}}
	}
	build := func(version string, settings []debug.BuildSetting) *debug.BuildInfo {
		return &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: version}, Settings: settings}
	}
	tests := []struct {
		name              string
		bi                *debug.BuildInfo
		version, revision string // -X
		want              Info
	}{
		{"checkout", build("v1.2.3", vcs("abc", "2026-01-02T03:04:05Z", "true")), "", "",
			Info{Version: "v1.2.3", Revision: "abc", Time: "2026-01-02T03:04:05Z", Modified: true, GoVersion: "go1.26.8"}},
		{"no VCS, stamped", build("(devel)", nil), "v1.4.0", "def",
			Info{Version: "v1.4.0", Revision: "def", GoVersion: "go1.26.8"}},
		{"no VCS, version only", build("(devel)", nil), "v1.4.0", "",
			Info{Version: "v1.4.0", GoVersion: "go1.26.8"}},
		{"no VCS, unstamped", build("(devel)", nil), "", "",
			Info{Version: "(devel, unstamped)", GoVersion: "go1.26.8"}},
		{"checkout, stamped", build("v0.0.0-2026-abc", vcs("abc", "2026-01-02T03:04:05Z", "false")), "v1.4.0", "abc",
			Info{Version: "v1.4.0", Revision: "abc", Time: "2026-01-02T03:04:05Z", GoVersion: "go1.26.8"}},
		{"stamped revision is not the checkout's", build("(devel)", vcs("abc", "2026-01-02T03:04:05Z", "true")), "", "def",
			Info{Version: "(devel)", Revision: "def", GoVersion: "go1.26.8"}},
		{"no build info", nil, "", "", Info{Version: "unknown"}},
		{"no build info, stamped", nil, "v1.4.0", "def", Info{Version: "v1.4.0", Revision: "def"}},
	}
	for _, tt := range tests {
		if got := read(tt.bi, tt.version, tt.revision); got != tt.want {
			t.Errorf("%s: read(%+v, %q, %q) = %+v, want %+v", tt.name, tt.bi, tt.version, tt.revision, got, tt.want)
		}
	}
}
