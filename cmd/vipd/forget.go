package main

import (
	"fmt"
	"os"

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
up within a second. A node that is still alive is remembered again at once.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if dir == "" {
				dir = os.Getenv("VIPD_STATE_DIR")
			}
			if dir == "" {
				dir = "/var/lib/vipd"
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
