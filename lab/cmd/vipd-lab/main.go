// Command vipd-lab runs vipd in a throwaway network-namespace lab:
//
//	vipd-lab demo            a 3-node cluster, a failover, the outage a client saw
//	vipd-lab bench -out DIR  failover benchmarks: a table, JSON and an SVG timeline
//
// It needs root (network namespaces) and never touches the host's own
// interfaces: every namespace, link and process it makes is removed on exit,
// also on Ctrl-C.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	var err error
	switch os.Args[1] {
	case "demo":
		err = demo(ctx, os.Args[2:])
	case "bench":
		err = bench(ctx, os.Args[2:])
	case "-h", "--help", "help":
		usage()
		return
	default:
		usage()
		os.Exit(2)
	}
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "vipd-lab:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprint(os.Stderr, `usage: vipd-lab demo
       vipd-lab bench [-out DIR] [-runs N] [-scenarios a,b,...]

demo   builds a 3-node lab with a client, shows who holds the VIP, fails the
       holder's apiserver, shows the new holder and the outage the client saw.
bench  measures client-visible outages for each failure scenario and writes
       DIR/bench.json and DIR/timeline.svg.

The vipd binary is $VIPD_TEST_BINARY, or built from this checkout. Root only.
`)
}

// tb adapts the lab's test hooks to a command: cleanups run at exit.
type tb struct {
	cleanups []func()
}

func (t *tb) Helper()                           {}
func (t *tb) Cleanup(f func())                  { t.cleanups = append(t.cleanups, f) }
func (t *tb) Logf(format string, args ...any)   { fmt.Fprintf(os.Stderr, format+"\n", args...) }
func (t *tb) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (t *tb) close() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
	t.cleanups = nil
}
