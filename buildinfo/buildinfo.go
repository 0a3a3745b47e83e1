// Package buildinfo says which build is running: `stockgate version`, the
// start-up log line and the stockgate_build_info metric all read it, so an
// operator can tell which replicas run what during a rollout.
package buildinfo

import (
	"fmt"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// Info is what the Go toolchain stamped into the binary.
type Info struct {
	Version   string // the main module's version, "(devel)" for a local build
	Revision  string // VCS revision, "" when not built from a checkout
	Time      string // VCS commit time
	Modified  bool   // built from a tree with uncommitted changes
	GoVersion string
}

// Read reads the running binary's build information.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: "unknown"}
	}
	in := Info{Version: bi.Main.Version, GoVersion: bi.GoVersion}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Revision = s.Value
		case "vcs.time":
			in.Time = s.Value
		case "vcs.modified":
			in.Modified = s.Value == "true"
		}
	}
	if in.Version == "" {
		in.Version = "unknown"
	}
	return in
}

func (in Info) String() string {
	rev := in.Revision
	if rev == "" {
		rev = "unknown revision"
	}
	if in.Modified {
		rev += " (modified)"
	}
	return fmt.Sprintf("stockgate %s, %s %s, %s", in.Version, rev, in.Time, in.GoVersion)
}

// Collector is the stockgate_build_info gauge: always 1, labelled with the
// build, as Prometheus's own build_info metrics are.
func Collector() prometheus.Collector {
	in := Read()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "stockgate_build_info",
		Help: "The running build: version, VCS revision and Go version, as labels; always 1.",
		ConstLabels: prometheus.Labels{"version": in.Version, "revision": in.Revision,
			"modified": fmt.Sprint(in.Modified), "goversion": in.GoVersion},
	})
	g.Set(1)
	return g
}
