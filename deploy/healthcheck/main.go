// Command healthcheck is the container healthcheck of settle's image. The
// image is distroless (no shell, no curl or wget), so the probe is a tiny
// static binary: it GETs one URL and exits 0 on a 2xx answer, 1 otherwise.
//
//	healthcheck http://127.0.0.1:8080/readyz
package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"
)

const (
	// timeout stays below any sensible healthcheck timeout, so a hung
	// endpoint fails the probe instead of being killed by the runtime.
	timeout = 3 * time.Second
	// bodyMax bounds what is read (and echoed on failure) from the answer.
	bodyMax = 4 << 10
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

func run(args []string, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintln(stderr, "usage: healthcheck URL")
		return 2
	}
	if err := probe(args[0]); err != nil {
		fmt.Fprintf(stderr, "healthcheck: %v\n", err)
		return 1
	}
	return 0
}

func probe(target string) error {
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an http(s) URL", target)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil) //nolint:gosec // G704: the URL is the HEALTHCHECK's argument
	if err != nil {
		return err
	}
	client := &http.Client{
		// A redirect would mean the URL is wrong; report it rather than follow.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := client.Do(req) //nolint:gosec // G704: the URL is the HEALTHCHECK's argument
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, bodyMax))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("%s answered %d: %s", u.Redacted(), resp.StatusCode, body)
	}
	return nil
}
