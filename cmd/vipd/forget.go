package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"github.com/vipd/vipd/cluster"
)

func newForgetCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "forget NODE",
		Short: "remove a node from the lease election's voters for good",
		Long: `forget asks the vipd running on this node (over its control socket,
VIPD_STATE_DIR/vipd.sock) to remove NODE from the voters of the lease
election: a configuration change agreed by a majority, run once on any one
node. Dead voters are also removed by themselves after a while while a
majority remains (docs/lease.md); forget is for the manual case.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Context() == nil {
				cmd.SetContext(context.Background())
			}
			if dir == "" {
				dir = os.Getenv("VIPD_STATE_DIR")
			}
			if dir == "" {
				dir = "/var/lib/vipd"
			}
			// The running daemon proposes the removal to the cluster (the
			// configuration is agreed, not a file).
			err := postForget(cmd.Context(), filepath.Join(dir, ControlSocket), args[0])
			if errors.Is(err, errNoDaemon) {
				return fmt.Errorf("%w: a member is forgotten by a running node (the voters are agreed, %s/%s is not edited); run vipd forget %s on a node where vipd runs", err, dir, cluster.LeaseStateFile, args[0])
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "forgot %s: removal from the lease election's voters proposed (see vipd status)\n", args[0])
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "state-dir", "", "state directory [env VIPD_STATE_DIR, default /var/lib/vipd]")
	return cmd
}
