package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// pgLink is a TCP fault proxy (Shopify's toxiproxy, in this process)
// between the gateway and its PostgreSQL ledger: the ledger faults slow
// it or cut it while both ends run on.
type pgLink struct {
	p   *toxiproxy.Proxy
	dsn string // the ledger's URL through the link
}

// newPGLink proxies the one-host PostgreSQL URL dsn on a free loopback
// port; stop ends it.
func newPGLink(dsn string) (*pgLink, error) {
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" || strings.Contains(u.Host, ",") {
		return nil, fmt.Errorf("link: %q is not a one-host PostgreSQL URL (%v)", dsn, err)
	}
	host := u.Host
	if _, _, err := net.SplitHostPort(host); err != nil {
		host = net.JoinHostPort(host, "5432")
	}
	p := toxiproxy.NewProxy(toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()), "ledger", "127.0.0.1:0", host)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("link to %s: %w", host, err)
	}
	u.Host = p.Listen
	return &pgLink{p: p, dsn: u.String()}, nil
}

func (l *pgLink) stop() { l.p.Stop() }

// latency adds d to every read both ways (a round trip pays 2d).
func (l *pgLink) latency(d time.Duration) error {
	for _, dir := range []string{"upstream", "downstream"} {
		if err := l.add(fmt.Sprintf(`{"name":"latency_%s","type":"latency","stream":%q,"attributes":{"latency":%d}}`,
			dir, dir, d.Milliseconds())); err != nil {
			return err
		}
	}
	return nil
}

// cut black-holes the link: every byte dropped, no connection closed.
func (l *pgLink) cut() error {
	for _, dir := range []string{"upstream", "downstream"} {
		if err := l.add(fmt.Sprintf(`{"name":"cut_%s","type":"timeout","stream":%q,"attributes":{"timeout":0}}`, dir, dir)); err != nil {
			return err
		}
	}
	return nil
}

// heal removes every fault.
func (l *pgLink) heal(ctx context.Context) { l.p.Toxics.ResetToxics(ctx) }

func (l *pgLink) add(spec string) error {
	_, err := l.p.Toxics.AddToxicJson(strings.NewReader(spec))
	return err
}
