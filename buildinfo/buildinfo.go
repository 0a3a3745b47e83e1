// Package buildinfo says which build is running: `stockgate version`, the
// start-up log line and the stockgate_build_info metric all read it, so an
// operator can tell which replicas run what during a rollout.
package buildinfo

import (
	"fmt"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// version and revision are stamped by a build that has no VCS checkout for
// the Go toolchain to read (docker build without .git, a source tarball):
//
//	go build -ldflags "-X github.com/stockgate/stockgate/buildinfo.version=v1.4.0 \
//	    -X github.com/stockgate/stockgate/buildinfo.revision=$(git rev-parse HEAD)"
//
// deploy/Dockerfile passes its VERSION and REVISION build arguments here.
// When set they are preferred over what the toolchain stamped.
var version, revision string

// unstamped is the version of a build that says nothing of its source: no
// VCS information and no -X version. The toolchain calls it "(devel)",
// which reads like a developer's checkout; an image built that way may be
// any source at all, and the version says so.
const unstamped = "(devel, unstamped)"

// Info is what the build stamped into the binary.
type Info struct {
	Version   string // -X version, else the main module's version; "(devel, unstamped)" when neither says anything
	Revision  string // -X revision, else the VCS revision; "" when unknown
	Time      string // VCS commit time
	Modified  bool   // built from a tree with uncommitted changes
	GoVersion string
}

// Read reads the running binary's build information.
func Read() Info {
	bi, _ := debug.ReadBuildInfo() // nil when the binary carries none
	return read(bi, version, revision)
}

// read is Read of the given build information (nil: none) and -X values.
func read(bi *debug.BuildInfo, version, revision string) Info {
	var in Info
	if bi != nil {
		in = Info{Version: bi.Main.Version, GoVersion: bi.GoVersion}
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
	}
	if revision != "" && revision != in.Revision {
		// The commit time and the modified flag are of another revision.
		in.Revision, in.Time, in.Modified = revision, "", false
	}
	switch {
	case version != "":
		in.Version = version
	case bi == nil || in.Version == "":
		in.Version = "unknown"
	case in.Version == "(devel)" && in.Revision == "":
		in.Version = unstamped
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
	if in.Time != "" {
		rev += " " + in.Time
	}
	return fmt.Sprintf("stockgate %s, %s, %s", in.Version, rev, in.GoVersion)
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
