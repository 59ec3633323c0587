// Package bfd is a single-hop asynchronous BFD (RFC 5880, RFC 5881).
package bfd
