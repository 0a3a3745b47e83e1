// Command dashshot draws the chart's Grafana dashboard from a real
// Prometheus: every panel of deploy/helm/stockgate/files/dashboard.json is
// evaluated with its own queries (the $namespace and $pod variables at
// "All") over the last -window, and drawn as an SVG line chart on one HTML
// page laid out by the panels' gridPos. deploy/local/dashboard.sh runs it
// against a Prometheus scraping `make run` under load, and Chromium turns
// the page into the README's picture.
//
// It exists because Grafana cannot be installed on the machines this
// project is built on (it is in neither Debian nor the Go or npm
// registries): the picture shows the dashboard's queries answered by a
// real scrape, drawn by this program rather than by Grafana.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"html"
	"math"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

func main() {
	var (
		promURL   = flag.String("prometheus", "http://127.0.0.1:9091", "Prometheus base URL")
		dashboard = flag.String("dashboard", "deploy/helm/stockgate/files/dashboard.json", "Grafana dashboard JSON")
		window    = flag.Duration("window", 5*time.Minute, "time range drawn, ending now")
		out       = flag.String("out", "dashboard.html", "HTML page written")
	)
	flag.Parse()
	if err := run(context.Background(), *promURL, *dashboard, *window, *out); err != nil {
		fmt.Fprintln(os.Stderr, "dashshot:", err)
		os.Exit(1)
	}
}

// Dashboard is the part of a Grafana dashboard this program draws.
type Dashboard struct {
	Title  string  `json:"title"`
	Panels []Panel `json:"panels"`
}

// Panel is one timeseries panel.
type Panel struct {
	Type    string `json:"type"`
	Title   string `json:"title"`
	GridPos struct {
		X, Y, W, H int
	} `json:"gridPos"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Targets []struct {
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
}

// Line is one drawn series.
type Line struct {
	Name   string
	Points []model.SamplePair
}

func run(ctx context.Context, promURL, path string, window time.Duration, out string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var d Dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	c, err := api.NewClient(api.Config{Address: promURL})
	if err != nil {
		return err
	}
	prom := promv1.NewAPI(c)
	end := time.Now()
	r := promv1.Range{Start: end.Add(-window), End: end, Step: window / 150}
	var b strings.Builder
	drawn := 0
	for _, p := range d.Panels {
		if p.Type != "timeseries" {
			continue
		}
		var lines []Line
		for _, t := range p.Targets {
			ls, err := query(ctx, prom, Expand(t.Expr), t.LegendFormat, r)
			if err != nil {
				return fmt.Errorf("panel %q: %w", p.Title, err)
			}
			lines = append(lines, ls...)
		}
		b.WriteString(Chart(p, lines, r))
		drawn++
	}
	if drawn == 0 {
		return errors.New("no timeseries panels")
	}
	page := fmt.Sprintf(pageHTML, html.EscapeString(d.Title),
		html.EscapeString(d.Title), end.UTC().Format("2006-01-02 15:04:05 UTC"), window, b.String())
	return os.WriteFile(out, []byte(page), 0o644)
}

// Expand sets the dashboard's variables to "All" as Grafana does with
// allValue ".*".
func Expand(expr string) string {
	return strings.NewReplacer("$namespace", ".*", "$pod", ".*", "$__rate_interval", "1m").Replace(expr)
}

func query(ctx context.Context, prom promv1.API, expr, legend string, r promv1.Range) ([]Line, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, _, _, err := prom.QueryRange(ctx, expr, r, promv1.WithTimeout(25*time.Second))
	if err != nil {
		return nil, err
	}
	m, ok := v.(model.Matrix)
	if !ok {
		return nil, fmt.Errorf("%s: answer is %s, not a matrix", expr, v.Type())
	}
	lines := make([]Line, 0, len(m))
	for _, s := range m {
		lines = append(lines, Line{Name: Legend(legend, s.Metric), Points: s.Values})
	}
	sort.Slice(lines, func(i, j int) bool { return lines[i].Name < lines[j].Name })
	return lines, nil
}

var legendVar = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)

// Legend fills a Grafana legendFormat ("{{route}}") from a series' labels;
// without one it names the series by its labels, as Grafana does.
func Legend(format string, m model.Metric) string {
	if format == "" {
		delete(m, model.MetricNameLabel)
		if len(m) == 0 {
			return "value"
		}
		return m.String()
	}
	return legendVar.ReplaceAllStringFunc(format, func(v string) string {
		return string(m[model.LabelName(legendVar.FindStringSubmatch(v)[1])])
	})
}

// Grafana's classic palette, in its order.
var palette = []string{"#7EB26D", "#EAB839", "#6ED0E0", "#EF843C", "#E24D42", "#1F78C1", "#BA43A9", "#705DA0", "#508642", "#CCA300"}

const (
	unitW  = 50 // pixels per gridPos column (24 columns)
	unitH  = 34 // pixels per gridPos row
	padL   = 64
	padR   = 12
	padTop = 30
	maxLeg = 8
)

// Chart draws one panel as an absolutely placed SVG.
func Chart(p Panel, lines []Line, r promv1.Range) string {
	w, h := p.GridPos.W*unitW-8, p.GridPos.H*unitH-8
	legRows := min(len(lines), maxLeg)
	plotH := h - padTop - 22 - legRows*15
	plotW := w - padL - padR
	top := 0.0
	for _, l := range lines {
		for _, s := range l.Points {
			if f := float64(s.Value); !math.IsNaN(f) && !math.IsInf(f, 0) && f > top {
				top = f
			}
		}
	}
	top = niceCeil(top)
	t0, t1 := float64(r.Start.Unix()), float64(r.End.Unix())
	x := func(t model.Time) float64 { return padL + (float64(t.Unix())-t0)/(t1-t0)*float64(plotW) }
	y := func(v float64) float64 { return padTop + float64(plotH) - v/top*float64(plotH) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="panel" style="left:%dpx;top:%dpx" width="%d" height="%d" xmlns="http://www.w3.org/2000/svg">`,
		p.GridPos.X*unitW+4, p.GridPos.Y*unitH+4, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" rx="3" fill="#181b1f" stroke="#2c3235"/>`, w, h)
	fmt.Fprintf(&b, `<text x="10" y="19" class="title">%s</text>`, html.EscapeString(p.Title))
	for i := 0; i <= 4; i++ {
		v := top * float64(i) / 4
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#2c3235"/>`, padL, padL+plotW, y(v), y(v))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" class="axis" text-anchor="end">%s</text>`, padL-6, y(v)+4, html.EscapeString(Format(v, p.FieldConfig.Defaults.Unit)))
	}
	for i := 0; i <= 4; i++ {
		t := r.Start.Add(time.Duration(i) * r.End.Sub(r.Start) / 4)
		anchor := map[int]string{0: "start", 4: "end"}[i]
		if anchor == "" {
			anchor = "middle"
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" class="axis" text-anchor="%s">%s</text>`,
			x(model.TimeFromUnix(t.Unix())), padTop+plotH+14, anchor, t.UTC().Format("15:04:05"))
	}
	if len(lines) == 0 {
		fmt.Fprintf(&b, `<text x="%d" y="%d" class="nodata" text-anchor="middle">No data</text>`, padL+plotW/2, padTop+plotH/2)
	}
	for i, l := range lines {
		color := palette[i%len(palette)]
		var d strings.Builder
		pen := false
		for _, s := range l.Points {
			f := float64(s.Value)
			if math.IsNaN(f) || math.IsInf(f, 0) {
				pen = false // a gap, as Grafana draws missing values
				continue
			}
			op := "L"
			if !pen {
				op = "M"
			}
			fmt.Fprintf(&d, "%s%.1f,%.1f ", op, x(s.Timestamp), y(f))
			pen = true
		}
		fmt.Fprintf(&b, `<path d="%s" fill="none" stroke="%s" stroke-width="1.5"/>`, d.String(), color)
		if i < maxLeg {
			ly := padTop + plotH + 24 + i*15
			name := l.Name
			if i == maxLeg-1 && len(lines) > maxLeg {
				name = fmt.Sprintf("… and %d more", len(lines)-maxLeg+1)
			}
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="3" fill="%s"/>`, padL, ly-5, color)
			fmt.Fprintf(&b, `<text x="%d" y="%d" class="legend">%s</text>`, padL+18, ly, html.EscapeString(name))
		}
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// niceCeil rounds a chart's top up to 1, 2 or 5 times a power of ten, so
// the four grid lines fall on readable values.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 4, 5, 8, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// Format writes an axis value in a Grafana unit.
func Format(v float64, unit string) string {
	switch unit {
	case "s":
		switch {
		case v == 0:
			return "0"
		case v < 1e-3:
			return trim(v*1e6) + " µs"
		case v < 1:
			return trim(v*1e3) + " ms"
		}
		return trim(v) + " s"
	case "percentunit":
		return trim(v*100) + "%"
	case "reqps":
		return short(v) + " req/s"
	case "ops":
		return short(v) + " ops/s"
	}
	return short(v)
}

func short(v float64) string {
	switch {
	case math.Abs(v) >= 1e6:
		return trim(v/1e6) + "M"
	case math.Abs(v) >= 1e3:
		return trim(v/1e3) + "K"
	}
	return trim(v)
}

func trim(v float64) string {
	s := fmt.Sprintf("%.2f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	if s == "-0" {
		return "0"
	}
	return s
}

const pageHTML = `<!doctype html>
<html><head><meta charset="utf-8"><title>%s</title>
<style>
body { margin: 0; background: #111217; font-family: Inter, "DejaVu Sans", Helvetica, Arial, sans-serif; color: #ccccdc; }
header { padding: 10px 14px; font-size: 15px; border-bottom: 1px solid #2c3235; }
header span { color: #8e8e9e; font-size: 12px; margin-left: 12px; }
main { position: relative; margin: 6px; height: 1940px; width: 1200px; }
.panel { position: absolute; }
.title { fill: #ccccdc; font-size: 13px; font-weight: 500; }
.axis { fill: #8e8e9e; font-size: 10px; }
.legend { fill: #ccccdc; font-size: 11px; }
.nodata { fill: #8e8e9e; font-size: 13px; }
</style></head><body>
<header>%s <span>namespace: All · pod: All · %s · last %s · every panel's own query, from a real Prometheus scrape</span></header>
<main>
%s</main></body></html>
`
