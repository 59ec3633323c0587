package lab

import (
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/packet"
	"golang.org/x/sys/unix"
)

// ARPRound is one question "who has the address?" asked by an ARPWatch and
// the MACs that answered it before the next question was asked.
type ARPRound struct {
	Sent time.Time
	MACs []string // sorted, each once
}

// ARPWatch asks, from a host, who has an IPv4 address every period and
// records which MACs answered each round: what a client on the segment
// sees, whichever node believes it holds the address. Two MACs in one round
// are two holders answering at once.
type ARPWatch struct {
	target netip.Addr
	self   netip.Addr
	c      *arp.Client
	raw    syscall.RawConn // the client's socket, for receive timestamps
	mu     sync.Mutex
	rounds []ARPRound
	stop   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
}

// StartARPWatch starts asking for target from the host's eth0 every period.
// It is stopped when the lab closes, or by Stop.
func (h *Host) StartARPWatch(target netip.Addr, period time.Duration) (*ARPWatch, error) {
	if !target.Is4() {
		return nil, fmt.Errorf("arp watch: %s is not an IPv4 address", target)
	}
	w := &ARPWatch{target: target, self: h.IPv4, stop: make(chan struct{})}
	err := h.Run(func() error {
		ifi, err := net.InterfaceByName(h.Link)
		if err != nil {
			return err
		}
		conn, err := packet.Listen(ifi, packet.Raw, unix.ETH_P_ARP, nil)
		if err != nil {
			return err
		}
		if w.raw, err = conn.SyscallConn(); err != nil {
			conn.Close()
			return err
		}
		if w.c, err = arp.New(ifi, conn); err != nil {
			conn.Close()
			return err
		}
		w.stamp() // the first call switches the socket's timestamps on
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("arp watch in %s: %w", h.NS, err)
	}
	w.wg.Add(2)
	go w.read()
	go w.ask(period)
	h.lab.OnClose(w.Stop)
	return w, nil
}

func (w *ARPWatch) ask(period time.Duration) {
	defer w.wg.Done()
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		w.mu.Lock()
		w.rounds = append(w.rounds, ARPRound{Sent: time.Now()})
		w.mu.Unlock()
		_ = w.c.Request(w.target)
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
	}
}

func (w *ARPWatch) read() {
	defer w.wg.Done()
	for {
		_ = w.c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		p, _, err := w.c.Read()
		select {
		case <-w.stop:
			return
		default:
		}
		if err != nil {
			// A deadline, or a frame that is not ARP: keep reading.
			continue
		}
		// Only answers to this watch's own questions: a gratuitous
		// announcement is not an answer (its target is the address itself).
		if p.Operation != arp.OperationReply || p.SenderIP != w.target || p.TargetIP != w.self {
			continue
		}
		// An answer belongs to the last question asked before the kernel
		// received it, however late this goroutine reads it.
		at := w.stamp()
		mac := p.SenderHardwareAddr.String()
		w.mu.Lock()
		i := len(w.rounds) - 1
		for i >= 0 && w.rounds[i].Sent.After(at) {
			i--
		}
		if i >= 0 {
			r := &w.rounds[i]
			j := sort.SearchStrings(r.MACs, mac)
			if j == len(r.MACs) || r.MACs[j] != mac {
				r.MACs = append(r.MACs, "")
				copy(r.MACs[j+1:], r.MACs[j:])
				r.MACs[j] = mac
			}
		}
		w.mu.Unlock()
	}
}

// stamp returns when the kernel received the last frame read from the
// socket (SIOCGSTAMPNS), or now if it cannot tell.
func (w *ARPWatch) stamp() time.Time {
	var ts unix.Timespec
	var errno syscall.Errno
	err := w.raw.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, unix.SIOCGSTAMPNS, uintptr(unsafe.Pointer(&ts)))
	})
	if err != nil || errno != 0 {
		return time.Now()
	}
	return time.Unix(ts.Unix())
}

// Stop ends the watch.
func (w *ARPWatch) Stop() {
	w.once.Do(func() {
		close(w.stop)
		w.wg.Wait()
		_ = w.c.Close()
	})
}

// Rounds returns the rounds asked so far (the last one may still collect
// answers).
func (w *ARPWatch) Rounds() []ARPRound {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]ARPRound, len(w.rounds))
	for i, r := range w.rounds {
		out[i] = ARPRound{Sent: r.Sent, MACs: append([]string(nil), r.MACs...)}
	}
	return out
}

// Between returns the rounds sent in [from, to).
func (w *ARPWatch) Between(from, to time.Time) []ARPRound {
	var out []ARPRound
	for _, r := range w.Rounds() {
		if !r.Sent.Before(from) && r.Sent.Before(to) {
			out = append(out, r)
		}
	}
	return out
}

// Multi returns the rounds sent in [from, to) that more than one MAC
// answered.
func (w *ARPWatch) Multi(from, to time.Time) []ARPRound {
	var out []ARPRound
	for _, r := range w.Between(from, to) {
		if len(r.MACs) > 1 {
			out = append(out, r)
		}
	}
	return out
}

// Timeline prints the changes of who answered, relative to origin.
func (w *ARPWatch) Timeline(origin time.Time) string {
	var b strings.Builder
	last := "-"
	for _, r := range w.Rounds() {
		cur := strings.Join(r.MACs, ",")
		if cur != last {
			fmt.Fprintf(&b, "%8.3fs [%s]\n", r.Sent.Sub(origin).Seconds(), cur)
			last = cur
		}
	}
	return b.String()
}
