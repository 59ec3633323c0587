// Package health probes the local kube-apiserver and decides whether this
// node is healthy enough to hold a virtual IP.
//
// A [Checker] sends GET to the configured URL (by default
// https://127.0.0.1:6443/livez) every interval, bounded by a timeout. Probes
// keep their connection (no TLS handshake per probe) for at most
// [ConnMaxAge]; a failed probe, changed credentials or CA, or a connection
// the server closed make the next probe dial anew. Every probe ends in one outcome with a
// stable reason label (see the Reason constants): "ok" is a success, every
// other reason is a failure. A [Tracker] turns the stream of outcomes into a
// health state: FailThreshold consecutive failures make the node unhealthy,
// RiseThreshold consecutive successes make it healthy again. The state starts
// unhealthy.
//
// # Drain
//
// With a readyz URL (VIPD_HEALTH_READYZ_URL) the checker also probes the
// apiserver's /readyz after every good /livez probe, on the same
// connection. kube-apiserver fails its "shutdown" readiness check as soon
// as it receives SIGTERM and keeps serving for --shutdown-delay-duration;
// a [Drain] turns that (or a /livez refused right after a good probe: a
// stop without a delay closes the listener at once) into a request for a
// planned handover, reported in Status.HandOver, and makes the node
// ineligible (Status.Eligible) once the caller reported the VIPs handed
// over (Checker.HandedOver), until the apiserver is back.
//
// # Credentials
//
// vipd runs under systemd, not in a pod, so it authenticates with what a
// control-plane host has: a client certificate and key (by default the
// kubelet's own rotating client certificate,
// /var/lib/kubelet/pki/kubelet-client-current.pem, certificate and key in
// one file) or a bearer token file. A probe sends one credential: the
// client certificate when one is loaded, otherwise the token. The
// certificate is always offered, even when the server does not list its CA
// as acceptable, so that a certificate from the wrong CA is rejected rather
// than silently turned into an anonymous request.
//
// Credential files (and the CA bundle) are re-read by one rule: while a
// file is missing or unusable it is tried on every probe, so a credential
// that appears is used by the very next probe; once loaded, its identity
// (symbolic link target, inode, size, modification time) is checked at most
// every five seconds and the file re-read when it was replaced or its link
// retargeted, and re-read anyway every five minutes. A client certificate
// that becomes unreadable or half-written keeps the previous one in use; a
// file that disappears is dropped.
//
// # The 401 rule
//
// Before the cluster is bootstrapped no credential exists yet (kubeadm and
// the kubelet write them later), and an apiserver that requires
// authentication (--anonymous-auth=false) answers 401 to an anonymous
// request. That 401 still proves the process is up, serving TLS and running
// its handler chain, so before any credential was loaded 200 and 401 are
// both healthy. Once a credential has been loaded (and for the rest of the
// process's life) only 200 is healthy: 401 or 403 is a failure with reason
// "credential_rejected", because an apiserver that rejects this node's own
// credential, or that answers 401 before looking at its storage, cannot be
// trusted to serve its clients.
//
// # TLS
//
// With a CA file the server certificate is verified against it. On a
// loopback URL only the chain is verified, not the host name: kubeadm's
// apiserver certificate does not name 127.0.0.1, and only the cluster CA can
// have signed what answers there. Until the
// CA file exists (by default /etc/kubernetes/pki/ca.crt, which kubeadm
// writes), verification is skipped, but only when the URL's host is a
// loopback address (127.0.0.0/8, ::1 or localhost): an unverified probe
// across the network could be answered by anyone. Once a CA bundle was
// loaded, verification is never skipped again.
package health
