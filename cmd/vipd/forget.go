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
		Short: "remove a node from the remembered cluster members for good",
		Long: `forget removes NODE from the members this node remembers (VIPD_STATE_DIR/members.json).
Quorum is a majority of the remembered members, so after a control-plane node
is decommissioned, run "vipd forget NODE" on every remaining node, or the
missing node keeps counting against quorum. A running vipd picks the change
up within a second. A node that is still alive is remembered again at once.

With VIPD_ELECTION=lease, forget asks the vipd running on this node (over its
control socket, VIPD_STATE_DIR/vipd.sock) to remove NODE from the voters: a
configuration change agreed by a majority, run once on any one node. Dead
voters are also removed by themselves after a while (docs/architecture.md).`,
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
			// The lease election: the running daemon proposes the removal
			// to the cluster (the configuration is agreed, not a file).
			switch err := postForget(cmd.Context(), filepath.Join(dir, ControlSocket), args[0]); {
			case err == nil:
				fmt.Fprintf(cmd.OutOrStdout(), "forgot %s: removal from the lease election's voters proposed (see vipd status)\n", args[0])
				return nil
			case errors.Is(err, errNoDaemon):
				if _, serr := os.Stat(filepath.Join(dir, cluster.LeaseStateFile)); serr == nil {
					return fmt.Errorf("%w: in the lease election (%s/%s) a member is forgotten by a running node; run vipd forget %s on a node where vipd runs", err, dir, cluster.LeaseStateFile, args[0])
				}
			case errors.Is(err, errNotLease):
			default:
				return err
			}
			ok, err := cluster.Forget(dir, args[0])
			if err != nil {
				return err
			}
			if !ok {
				return usageError{fmt.Errorf("%s is not a remembered member (see %s/%s)", args[0], dir, cluster.MembersFile)}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "forgot %s\n", args[0])
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "state-dir", "", "state directory [env VIPD_STATE_DIR, default /var/lib/vipd]")
	return cmd
}
