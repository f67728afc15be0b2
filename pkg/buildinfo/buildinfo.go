// Package buildinfo names the build a binary came from: a version and a
// VCS revision, stamped at link time
//
//	go build -ldflags "-X github.com/settle/settle/pkg/buildinfo.version=1.2.3 -X github.com/settle/settle/pkg/buildinfo.revision=abc123"
//
// and otherwise read from what the Go toolchain recorded (vcs.revision,
// the module version), so a plain `go build` in a checkout still says
// which commit it is.
package buildinfo

import (
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// Unknown is reported for what neither the linker nor the toolchain said.
const Unknown = "unknown"

// Set by -ldflags "-X"; strings only, so they stay package variables.
var (
	version  string
	revision string
)

// Info is one build's identity.
type Info struct {
	Version  string
	Revision string
}

// Get returns the stamped values, else the toolchain's, else Unknown.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return resolve(version, revision, bi)
}

// resolve prefers the stamped values; apart for testing.
func resolve(stampedVersion, stampedRevision string, bi *debug.BuildInfo) Info {
	info := Info{Version: stampedVersion, Revision: stampedRevision}
	if bi != nil {
		if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
		if info.Revision == "" {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" {
					info.Revision = s.Value
				}
			}
		}
	}
	if info.Version == "" {
		info.Version = Unknown
	}
	if info.Revision == "" {
		info.Revision = Unknown
	}
	return info
}

// String is "version (revision)", as `settlectl version` prints it.
func (i Info) String() string {
	return i.Version + " (" + i.Revision + ")"
}

// Collector is settle_build_info{version,revision}, always 1: join it
// onto other series to see which build exported them.
func Collector() prometheus.Collector {
	return collector(Get())
}

func collector(i Info) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "settle_build_info",
		Help: "Always 1; the labels name the build of this process.",
	}, []string{"version", "revision"})
	g.WithLabelValues(i.Version, i.Revision).Set(1)
	return g
}
