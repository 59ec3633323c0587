// Package health probes the local kube-apiserver and decides whether this
// node is healthy enough to hold a virtual IP.
//
// A [Checker] sends GET to the configured URL (by default
// https://127.0.0.1:6443/livez) every interval, each probe on a fresh
// connection and bounded by a timeout. Every probe ends in one outcome with a
// stable reason label (see the Reason constants): "ok" is a success, every
// other reason is a failure. A [Tracker] turns the stream of outcomes into a
// health state: FailThreshold consecutive failures make the node unhealthy,
// RiseThreshold consecutive successes make it healthy again. The state starts
// unhealthy.
//
// # The 401 rule
//
// When a service-account token file is readable, the checker sends it as a
// bearer token and only 200 counts as healthy: an apiserver that rejects a
// valid token (401) or forbids the request (403) is broken for its clients
// too. Before the cluster is bootstrapped there is no token yet (kubeadm
// writes it later), and an apiserver that requires authentication for /livez
// answers 401 to an anonymous request. That 401 still proves the process is
// up, serving TLS and running its handler chain, so without a token 200 and
// 401 are both healthy. Once a token exists a 401 is a failure: it is what
// an apiserver with a broken authenticator (or a revoked token) returns.
//
// The token file is re-read at most every five minutes, and on every probe
// while it is missing or empty, so a token that appears is used at once and
// a rotated token is picked up within five minutes.
//
// # TLS
//
// With a CA file the server certificate is verified against it. Without one,
// verification is skipped, but only when the URL's host is a loopback
// address (127.0.0.0/8, ::1 or localhost): an unverified probe across the
// network could be answered by anyone.
package health
