package main

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"github.com/vipd/vipd/config"
)

func newKeygenCmd() *cobra.Command {
	var out string
	var force bool
	cmd := &cobra.Command{
		Use:   "keygen",
		Short: "make a new gossip encryption key (for VIPD_GOSSIP_KEY_FILE)",
		Long: `keygen makes a new gossip key: 32 random bytes (AES-256), base64-encoded on
one line, the format VIPD_GOSSIP_KEY_FILE is read in. Copy the same file to
every node (mode 0600, root only) and set VIPD_GOSSIP_KEY_FILE to its path.

With --out the key is written to that file, created with mode 0600; an
existing file is kept unless --force is given (then it is replaced
atomically). Without --out the key is printed on standard output.

  vipd keygen --out /etc/vipd/gossip.key`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			key := make([]byte, config.GossipKeySize)
			if _, err := rand.Read(key); err != nil {
				return fmt.Errorf("keygen: %w", err)
			}
			text := config.EncodeGossipKey(key)
			if out == "" {
				_, err := fmt.Fprint(cmd.OutOrStdout(), text)
				return err
			}
			return writeKeyFile(out, text, force)
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "write the key to this file (mode 0600) instead of standard output")
	cmd.Flags().BoolVar(&force, "force", false, "replace the --out file if it exists")
	return cmd
}

// writeKeyFile writes text to path with mode 0600: a new file is created
// exclusively; with force an existing one is replaced by a rename, so a
// reader never sees half a key and the mode is 0600 whatever the old file's
// was.
func writeKeyFile(path, text string, force bool) error {
	if !force {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			return usageError{fmt.Errorf("keygen: %s exists: keep it, or replace it with --force (every node needs the same key)", path)}
		}
		if err != nil {
			return usageError{fmt.Errorf("keygen: %w", err)}
		}
		if _, err := f.WriteString(text); err != nil {
			f.Close()
			os.Remove(path)
			return fmt.Errorf("keygen: write %s: %w", path, err)
		}
		if err := f.Sync(); err != nil {
			f.Close()
			os.Remove(path)
			return fmt.Errorf("keygen: write %s: %w", path, err)
		}
		return f.Close()
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return usageError{fmt.Errorf("keygen: %w", err)}
	}
	defer os.Remove(tmp.Name()) // after a successful rename there is nothing to remove
	// CreateTemp makes the file 0600 already; say so for the umask-proof record.
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("keygen: %w", err)
	}
	if _, err := tmp.WriteString(text); err != nil {
		tmp.Close()
		return fmt.Errorf("keygen: write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("keygen: write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("keygen: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("keygen: %w", err)
	}
	return nil
}
