package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	vcluster "github.com/vipd/vipd/cluster"
)

// stressResult is one profile's false-failover run: a 5-node cluster left
// alone while stress-ng loads the machine's cores.
type stressResult struct {
	Profile     string  `json:"profile"`
	Nodes       int     `json:"nodes"`
	StressCores int     `json:"stress_cores"`
	Seconds     float64 `json:"seconds"`
	// Failovers counts every change of the holder set after the cluster
	// settled (the VIP moving, or held by none or two): the target is 0.
	Failovers int      `json:"failovers"`
	Changes   []string `json:"changes,omitempty"`
	// Late counts the lease loops' lateness warnings (a wake-up or step
	// that lost over half the silence the lease outlives: "lease
	// election: this node woke late ..." / "... one step took long"), at
	// most one per node per 10 s; LateLines are the first of them, each
	// after its node's name. A holder change without one on the old
	// holder was messages lost on the way, not a starved node.
	Late      int      `json:"late_warnings"`
	LateLines []string `json:"late_warning_lines,omitempty"`
}

// lateMarks are the lease loop's lateness warnings (cluster/leaselate.go).
var lateMarks = []string{vcluster.LateWakeWarning, vcluster.LongStepWarning}

// lateWarnings returns the lines of out that are lateness warnings.
func lateWarnings(out string) []string {
	var ls []string
	for _, line := range strings.Split(out, "\n") {
		for _, m := range lateMarks {
			if strings.Contains(line, m) {
				ls = append(ls, line)
				break
			}
		}
	}
	return ls
}

// stressRun runs the default and the fast profile side by side (two labs
// of 5 nodes at once) for d while `stress-ng --cpu 2` loads the machine.
func stressRun(ctx context.Context, d time.Duration, logs string) ([]stressResult, error) {
	bin, err := exec.LookPath("stress-ng")
	if err != nil {
		return nil, fmt.Errorf("stress-ng not found (apt-get install stress-ng; make deps does): %w", err)
	}
	fmt.Fprintf(os.Stderr, "== stress: 5 nodes per profile, stress-ng on 2 cores, %v\n", d)
	profiles := []impl{impls[0], impls[1]}
	out := make([]stressResult, len(profiles))
	errs := make([]error, len(profiles))
	var wg sync.WaitGroup
	started := make(chan struct{}, len(profiles))
	begin := make(chan struct{})
	for i, im := range profiles {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = stressOne(ctx, im, d, bin, i == 0, started, begin, logs)
		}()
	}
	go func() {
		for range profiles {
			<-started
		}
		close(begin)
	}()
	wg.Wait()
	for _, e := range errs {
		if e != nil {
			return out, e
		}
	}
	return out, nil
}

// stressOne runs one profile's cluster; the first one also runs stress-ng
// (in its client namespace). Both start measuring together (begin).
func stressOne(ctx context.Context, im impl, d time.Duration, stressBin string, load bool, started chan<- struct{}, begin <-chan struct{}, logs string) (res stressResult, err error) {
	t := &tb{}
	signalled := false
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
		if !signalled {
			started <- struct{}{}
		}
		t.close()
	}()
	profile := strings.TrimPrefix(im.name, "vipd-")
	res = stressResult{Profile: profile, Nodes: 5, StressCores: 2}
	c, err := newCluster(ctx, t, 5, im.env...)
	if err != nil {
		return res, err
	}
	c.impl = im
	if err := c.start(); err != nil {
		return res, err
	}
	defer c.dumpLogs(logs, "stress-"+im.name)
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	holder, err := c.stableHolder(wctx, 3*time.Second)
	if err != nil {
		return res, err
	}
	signalled = true
	started <- struct{}{}
	select {
	case <-begin:
	case <-ctx.Done():
		return res, ctx.Err()
	}
	if load {
		secs := int((d + 5*time.Second).Seconds())
		if _, err := c.Client.Start("stress-ng", nil, stressBin, "--cpu", "2", "--timeout", fmt.Sprintf("%ds", secs), "--quiet"); err != nil {
			return res, err
		}
	}
	from := time.Now()
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(d):
	}
	res.Seconds = time.Since(from).Seconds()
	for _, s := range c.mon.Samples() {
		if s.At.After(from) && !(len(s.Holders) == 1 && s.Holders[0] == holder) {
			res.Failovers++
			res.Changes = append(res.Changes, fmt.Sprintf("%s: %v", s.At.Sub(from).Round(time.Millisecond), s.Holders))
		}
	}
	for _, n := range c.Nodes {
		p := c.vipd[n.Name]
		if p == nil {
			continue
		}
		ls := lateWarnings(p.Output())
		res.Late += len(ls)
		for _, l := range ls {
			if len(res.LateLines) < 20 {
				res.LateLines = append(res.LateLines, n.Name+": "+l)
			}
		}
	}
	fmt.Fprintf(os.Stderr, "   %s: %d failovers, %d lateness warnings in %v\n", im.name, res.Failovers, res.Late, time.Duration(res.Seconds*float64(time.Second)).Round(time.Second))
	return res, nil
}
