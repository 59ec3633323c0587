package main

import (
	"context"
	"flag"
	"fmt"
)

func bench(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	if err := fs.Parse(args); err != nil {
		return err
	}
	return fmt.Errorf("not yet")
}
