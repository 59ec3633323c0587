// Command fakeapiserver answers GET /livez with 200 over TLS (a fresh
// self-signed certificate), standing in for kube-apiserver inside the
// package-install test's container. The answer can be changed at run time
// by writing a status code into the file named by -status-file. With -name
// every other path answers 200 with that name, as the lab's apiservers do
// for a client probing the VIP (lab.Host.Probe).
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"flag"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	addr := flag.String("listen", "127.0.0.1:6443", "listen address")
	statusFile := flag.String("status-file", "", "file holding the HTTP status to answer (default 200)")
	name := flag.String("name", "", "answer every path but /livez with 200 and this name (the lab's probe)")
	flag.Parse()

	cert, err := selfSigned()
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		code := http.StatusOK
		if *statusFile != "" {
			if b, err := os.ReadFile(*statusFile); err == nil {
				if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n >= 100 && n <= 599 {
					code = n
				}
			}
		}
		w.WriteHeader(code)
		_, _ = w.Write([]byte(http.StatusText(code)))
	})
	if *name != "" {
		mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(*name + "\n"))
		})
	}
	srv := &http.Server{
		Addr:              *addr,
		Handler:           mux,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 5 * time.Second,
	}
	log.Printf("fake apiserver on https://%s/livez", *addr)
	log.Fatal(srv.ListenAndServeTLS("", ""))
}

func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
