package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/settle/settle/pkg/buildinfo"
	"github.com/settle/settle/pkg/config"
)

func init() {
	register("version", "print the version and VCS revision of this build", runVersion)
}

func runVersion(_ context.Context, args []string, out io.Writer) error {
	if len(args) == 1 && isHelp(args[0]) {
		fmt.Fprintln(out, "usage: settlectl version")
		return flag.ErrHelp
	}
	if len(args) > 0 {
		return fmt.Errorf("%w: version takes no arguments", config.ErrUsage)
	}
	i := buildinfo.Get()
	_, err := fmt.Fprintf(out, "version %s\nrevision %s\n", i.Version, i.Revision)
	return err
}
