package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// idleResult is the idle cost of one contender: each node of a 3-node l2
// cluster (holder included), past the start and the announce burst.
type idleResult struct {
	Impl       string    `json:"impl"`
	Nodes      int       `json:"nodes"`
	Seconds    float64   `json:"seconds"`
	RSSMB      []float64 `json:"rss_mb"`                  // per node, mean of the samples (keepalived: its processes together)
	RSSPeakMB  []float64 `json:"rss_peak_mb"`             // per node, the largest sample
	Samples    int       `json:"rss_samples"`             // per node, every rssSampleEvery
	CPUPercent []float64 `json:"cpu_percent_of_one_core"` // per node
	RSSMeanMB  float64   `json:"rss_mean_mb"`
	RSSMaxMB   float64   `json:"rss_max_mb"` // the largest per-node mean
	CPUMeanPct float64   `json:"cpu_mean_percent"`
	CPUMaxPct  float64   `json:"cpu_max_percent"`
	// RunsPerSecond: per node, how often a thread of it was put on a CPU
	// (the scheduler's count of time slices), a second. Unlike the CPU
	// share, it does not depend on what a wake-up costs on the machine
	// (on this paravirtualised VM 100 to 300 us of cold caches each), so
	// it compares two builds or two contenders across machines.
	RunsPerSecond []float64 `json:"runs_per_second"`
	// CPUPerRunUS: per node, the CPU time of the window over its runs.
	CPUPerRunUS []float64 `json:"cpu_per_run_us"`
	// NeighbourFPS: ARP and neighbour solicitation / advertisement frames
	// a second on the segment (seen from the client): the wire cost of the
	// announcements and of the verification rounds.
	NeighbourFPS float64 `json:"neighbour_frames_per_second"`
	Target       string  `json:"target,omitempty"`
	Met          *bool   `json:"target_met,omitempty"`
}

// defaultIdle is how long the idle cost is measured (bench -idle). A
// minute: memberlist's full state exchange runs every 30 s per node, and
// vipd trims its resident set every minute, so a shorter window lands on
// one side or the other of those (20 s windows read 0.25 and 0.31 % for
// the same code in two runs).
const defaultIdle = 60 * time.Second

// rssSampleEvery is how often the resident set is read during the idle
// window: it moves with each garbage collection and each trim, and one
// reading at the end was the lucky or the unlucky side of them.
const rssSampleEvery = 2 * time.Second

// measureIdle runs a 3-node cluster of one contender and reads each
// node's CPU time over d (from /proc at both ends) and its resident
// memory every rssSampleEvery (mean and peak of the samples).
func measureIdle(ctx context.Context, im impl, d time.Duration) (res idleResult, err error) {
	t := &tb{}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
		t.close()
	}()
	res = idleResult{Impl: im.name, Nodes: 3}
	fmt.Fprintf(os.Stderr, "== idle / %s (3-node l2 cluster, %v)\n", im.name, d)
	c, err := newCluster(ctx, t, 3, im.env...)
	if err != nil {
		return res, err
	}
	c.impl = im
	if err := c.start(); err != nil {
		return res, err
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := c.stableHolder(wctx, time.Second); err != nil {
		return res, err
	}
	time.Sleep(7 * time.Second) // past the announce burst
	var pids []int
	for _, n := range c.Nodes {
		pids = append(pids, c.vipd[n.Name].Pid())
	}
	at0 := make([]schedStat, len(pids))
	for i, p := range pids {
		if at0[i], err = groupSched(p); err != nil {
			return res, err
		}
	}
	capture, err := c.Client.StartCapture(ctx, "arp or ( icmp6 and ip6[40] >= 135 and ip6[40] <= 136 )")
	if err != nil {
		return res, err
	}
	frames0 := len(capture.Frames())
	start := time.Now()
	end := start.Add(d)
	rss := make([][]float64, len(pids))
	tick := time.NewTicker(rssSampleEvery)
	defer tick.Stop()
	for {
		for i, p := range pids {
			mb, err := groupRSSMB(p)
			if err != nil {
				return res, err
			}
			rss[i] = append(rss[i], mb)
		}
		left := time.Until(end)
		if left <= 0 {
			break
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-tick.C:
		case <-time.After(left):
		}
	}
	el := time.Since(start).Seconds()
	res.Seconds = el
	res.NeighbourFPS = float64(len(capture.Frames())-frames0) / el
	for i, p := range pids {
		at1, err := groupSched(p)
		if err != nil {
			return res, err
		}
		res.RSSMB = append(res.RSSMB, mean(rss[i]))
		res.RSSPeakMB = append(res.RSSPeakMB, maxOf(rss[i]))
		res.Samples = len(rss[i])
		cpu, runs := at1.cpuNS-at0[i].cpuNS, at1.runs-at0[i].runs
		res.CPUPercent = append(res.CPUPercent, float64(cpu)/1e9/el*100)
		res.RunsPerSecond = append(res.RunsPerSecond, float64(runs)/el)
		perRun := 0.0
		if runs > 0 {
			perRun = float64(cpu) / 1e3 / float64(runs)
		}
		res.CPUPerRunUS = append(res.CPUPerRunUS, perRun)
	}
	res.RSSMeanMB, res.RSSMaxMB = mean(res.RSSMB), maxOf(res.RSSMB)
	res.CPUMeanPct, res.CPUMaxPct = mean(res.CPUPercent), maxOf(res.CPUPercent)
	if im.name == "vipd-default" {
		res.Target = "<= 20 MB and <= 0.3 % per node"
		met := res.RSSMaxMB <= 20 && res.CPUMaxPct <= 0.3
		res.Met = &met
	}
	return res, nil
}

// idleChecksOff is measured next to vipd-default in the idle scenario
// only: the same cluster without the verification rounds (issue 27), so
// that the difference is what the checks cost.
var idleChecksOff = impl{name: "vipd-default-noverify", env: []string{"VIPD_VERIFY_INTERVAL=off"}}

// groupPids returns the processes of the process group led by pid (vipd:
// itself; keepalived: its parent and VRRP child).
func groupPids(pid int) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		if len(f) > 2 && f[2] == strconv.Itoa(pid) {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no process in group %d", pid)
	}
	return out, nil
}

// schedStat is what the scheduler accounts for a group of threads: the
// CPU time they ran and how many time slices they ran it in.
type schedStat struct {
	cpuNS int64
	runs  int64
}

// groupSched sums /proc/PID/task/TID/schedstat over the threads of the
// processes of pid's group. It reads the scheduler's own account:
// /proc/PID/stat's utime and stime are sampled at the 10 ms tick, which
// for a process that runs a few hundred microseconds at a time is off by
// a third over 20 s.
func groupSched(pid int) (schedStat, error) {
	ps, err := groupPids(pid)
	if err != nil {
		return schedStat{}, err
	}
	var sum schedStat
	for _, p := range ps {
		tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", p))
		if err != nil {
			return schedStat{}, err
		}
		for _, t := range tasks {
			b, err := os.ReadFile(t)
			if err != nil {
				continue // the thread ended
			}
			st, err := parseSchedstat(string(b))
			if err != nil {
				return schedStat{}, fmt.Errorf("%s: %w", t, err)
			}
			sum.cpuNS += st.cpuNS
			sum.runs += st.runs
		}
	}
	return sum, nil
}

// parseSchedstat reads one thread's schedstat line: the nanoseconds it
// ran, the nanoseconds it waited to run, and the time slices it ran in
// (Documentation/scheduler/sched-stats.rst).
func parseSchedstat(line string) (schedStat, error) {
	f := strings.Fields(line)
	if len(f) != 3 {
		return schedStat{}, fmt.Errorf("schedstat %q: want three numbers", strings.TrimSpace(line))
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return schedStat{}, fmt.Errorf("schedstat %q: %w", strings.TrimSpace(line), err)
	}
	runs, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil {
		return schedStat{}, fmt.Errorf("schedstat %q: %w", strings.TrimSpace(line), err)
	}
	return schedStat{cpuNS: ns, runs: runs}, nil
}

func groupRSSMB(pid int) (float64, error) {
	ps, err := groupPids(pid)
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, p := range ps {
		r, err := rssMB(p)
		if err != nil {
			return 0, err
		}
		sum += r
	}
	return sum, nil
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}
