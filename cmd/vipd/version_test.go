package main

import (
	"runtime/debug"
	"testing"
)

func TestBuildCommit(t *testing.T) {
	vcs := func(kv ...string) *debug.BuildInfo {
		bi := &debug.BuildInfo{}
		for i := 0; i < len(kv); i += 2 {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return bi
	}
	for _, tc := range []struct {
		name   string
		linked string
		info   *debug.BuildInfo
		want   string
	}{
		{"linked wins", "abc123", vcs("vcs.revision", "def456"), "abc123"},
		{"toolchain stamp", "", vcs("vcs.revision", "def456", "vcs.modified", "false"), "def456"},
		{"dirty tree", "", vcs("vcs.revision", "def456", "vcs.modified", "true"), "def456-dirty"},
		{"no vcs", "", vcs(), "unknown"},
		{"no build info", "", nil, "unknown"},
	} {
		if got := buildCommit(tc.linked, tc.info); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
