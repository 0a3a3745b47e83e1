package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"
)

func main() {
	var o Options
	var platforms, epoch string
	flag.StringVar(&o.Repo, "repo", "../..", "the repository's root")
	flag.StringVar(&o.Out, "out", "../../dist", "where the artifacts go")
	flag.StringVar(&o.Version, "version", "", "the release's version (vMAJOR.MINOR.PATCH[-PRE])")
	flag.StringVar(&o.Revision, "revision", "", "the commit it is built from")
	flag.StringVar(&epoch, "epoch", os.Getenv("SOURCE_DATE_EPOCH"), "every time in the image, Unix seconds (default SOURCE_DATE_EPOCH, else 0)")
	flag.StringVar(&platforms, "platforms", "linux/amd64,linux/arm64", "the image's platforms")
	flag.StringVar(&o.Helm, "helm", "helm", `the helm binary that packages the chart ("": no chart)`)
	flag.StringVar(&o.Certs, "certs", "/etc/ssl/certs/ca-certificates.crt", `the CA bundle the image carries ("": none)`)
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "release: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	sec := int64(0)
	if epoch != "" {
		var err error
		if sec, err = strconv.ParseInt(epoch, 10, 64); err != nil {
			fmt.Fprintf(os.Stderr, "release: epoch %q is not Unix seconds\n", epoch)
			os.Exit(2)
		}
	}
	o.Epoch = time.Unix(sec, 0).UTC()
	o.Platforms = strings.Split(platforms, ",")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, err := Build(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("image %s (OCI layout %s)\n", res.Digest, res.Image)
	if res.Chart != "" {
		fmt.Printf("chart %s\n", res.Chart)
	}
}
