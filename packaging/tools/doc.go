// Package tools pins the build tools used to package vipd (nfpm) in a module
// of their own, so their dependencies never enter vipd's own module graph.
// Run them with `go tool -modfile=packaging/tools/go.mod nfpm ...` from the
// repository root, or `go tool nfpm` from this directory.
package tools
