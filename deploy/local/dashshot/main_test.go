package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// Every panel of the chart's dashboard is one dashshot draws: a panel of
// another type would be missing from the README's picture.
func TestDrawsEveryPanelOfTheChartsDashboard(t *testing.T) {
	raw, err := os.ReadFile("../../helm/stockgate/files/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d Dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Panels) == 0 {
		t.Fatal("no panels")
	}
	r := promv1.Range{Start: time.Unix(0, 0), End: time.Unix(300, 0), Step: 2 * time.Second}
	for _, p := range d.Panels {
		if p.Type != "timeseries" {
			t.Errorf("panel %q is a %s; dashshot draws timeseries only", p.Title, p.Type)
		}
		for _, tg := range p.Targets {
			if e := Expand(tg.Expr); strings.Contains(e, "$") {
				t.Errorf("panel %q: variable left in %s", p.Title, e)
			}
		}
		svg := Chart(p, []Line{{Name: "a", Points: []model.SamplePair{{Timestamp: 0, Value: 1}, {Timestamp: 300_000, Value: 3}}}}, r)
		if !strings.Contains(svg, "<path d=\"M") || !strings.Contains(svg, p.Title[:5]) {
			t.Errorf("panel %q drew no line: %s", p.Title, svg)
		}
	}
}

func TestLegendAndUnits(t *testing.T) {
	m := model.Metric{"__name__": "x", "route": "/v1/a", "code": "201"}
	if got := Legend("{{route}} {{ code }}", m); got != "/v1/a 201" {
		t.Errorf("legend %q", got)
	}
	if got := Legend("", model.Metric{"__name__": "x"}); got != "value" {
		t.Errorf("legend of a bare series %q", got)
	}
	for _, c := range []struct {
		v    float64
		unit string
		want string
	}{
		{0.0125, "s", "12.5 ms"}, {0.00005, "s", "50 µs"}, {2, "s", "2 s"}, {0.25, "percentunit", "25%"},
		{1500, "reqps", "1.5K req/s"}, {2e6, "short", "2M"}, {0, "s", "0"},
	} {
		if got := Format(c.v, c.unit); got != c.want {
			t.Errorf("Format(%v, %s) = %q, want %q", c.v, c.unit, got, c.want)
		}
	}
	for v, want := range map[float64]float64{0: 1, 3: 4, 1100: 2000, 19: 20, 0.07: 0.08} {
		if got := niceCeil(v); got < want*0.999 || got > want*1.001 {
			t.Errorf("niceCeil(%v) = %v, want %v", v, got, want)
		}
	}
}
