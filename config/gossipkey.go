package config

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"os"
	"strings"
)

// GossipKeySize is the size of the keys `vipd keygen` makes (AES-256).
const GossipKeySize = 32

// EncodeGossipKey returns key as VIPD_GOSSIP_KEY_FILE holds it: standard
// base64 and a newline.
func EncodeGossipKey(key []byte) string {
	return base64.StdEncoding.EncodeToString(key) + "\n"
}

// ReadGossipKeys reads VIPD_GOSSIP_KEY_FILE into c.GossipKeys. Nothing to
// do when it is not set. Errors name the setting and the file, never a key.
func (c *Config) ReadGossipKeys() error {
	c.GossipKeys = nil
	if c.GossipKeyFile == "" {
		return nil
	}
	b, err := os.ReadFile(c.GossipKeyFile)
	if err != nil {
		return fmt.Errorf("VIPD_GOSSIP_KEY_FILE: %w", err)
	}
	keys, err := ParseGossipKeys(b)
	if err != nil {
		return fmt.Errorf("VIPD_GOSSIP_KEY_FILE %s: %w", c.GossipKeyFile, err)
	}
	c.GossipKeys = keys
	return nil
}

// ParseGossipKeys parses the content of a gossip key file: one key per
// line, the first the primary key (memberlist encrypts with it; the
// others are only accepted, for a rotation). A key is read as the cluster
// package reads its single key: base64 of 16, 24 or 32 bytes, else a raw
// 16, 24 or 32 byte string, else any other text as a passphrase whose
// SHA-256 is the key. Blank lines and lines starting with # are skipped.
func ParseGossipKeys(b []byte) ([][]byte, error) {
	var keys [][]byte
	for _, line := range strings.Split(string(b), "\n") {
		s := strings.TrimSpace(line)
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		keys = append(keys, parseGossipKey(s))
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("no key: want a key of 16, 24 or 32 bytes (base64 or raw) or a passphrase; make one with `vipd keygen --out FILE`")
	}
	return keys, nil
}

func parseGossipKey(s string) []byte {
	if k, err := base64.StdEncoding.DecodeString(s); err == nil && validGossipKeyLen(len(k)) {
		return k
	}
	if validGossipKeyLen(len(s)) {
		return []byte(s)
	}
	k := sha256.Sum256([]byte(s))
	return k[:]
}

func validGossipKeyLen(n int) bool { return n == 16 || n == 24 || n == 32 }
