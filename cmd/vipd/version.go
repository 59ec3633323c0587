package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// commit is set at link time (-ldflags "-X main.commit=..."); empty means
// the one the Go toolchain stamped from git, if any.
var commit = ""

// buildCommit returns the commit vipd was built from: the link-time value,
// else the toolchain's vcs.revision (with "-dirty" for a modified tree),
// else "unknown".
func buildCommit(linked string, info *debug.BuildInfo) string {
	if linked != "" {
		return linked
	}
	if info == nil {
		return "unknown"
	}
	rev, dirty := "", false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "unknown"
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "print the version, the commit and the Go version vipd was built with",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info, _ := debug.ReadBuildInfo()
			fmt.Fprintf(cmd.OutOrStdout(), "vipd %s\ncommit: %s\ngo: %s\n", version, buildCommit(commit, info), runtime.Version())
			return nil
		},
	}
}
