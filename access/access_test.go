package access_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stockgate/stockgate/access"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

var (
	opens  = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	closes = opens.Add(time.Hour)
	secret = access.SecretOf("partner-credential-0001")
)

func TestCheck(t *testing.T) {
	window := access.Rule{OpensAt: opens, ClosesAt: closes}
	for _, c := range []struct {
		name   string
		rule   access.Rule
		p      access.Presented
		at     time.Time
		want   error
		reason string
	}{
		{"open, no window", access.Rule{}, access.Presented{}, opens, nil, ""},
		{"before the window", window, access.Presented{}, opens.Add(-time.Millisecond), access.ErrNotOpen, "not-open"},
		{"at the opening", window, access.Presented{}, opens, nil, ""},
		{"just before the close", window, access.Presented{}, closes.Add(-time.Millisecond), nil, ""},
		{"at the close", window, access.Presented{}, closes, access.ErrClosed, "closed"},
		{"closed early", access.Rule{ClosedAt: opens}, access.Presented{}, opens.Add(-time.Hour), access.ErrClosed, "closed"},
		{"closed beats not open", access.Rule{OpensAt: opens, ClosedAt: opens}, access.Presented{}, opens.Add(-time.Hour), access.ErrClosed, "closed"},
		{"code pool without a code", access.Rule{Access: access.Code}, access.Presented{}, opens, access.ErrDenied, "denied"},
		{"code pool with a code", access.Rule{Access: access.Code}, access.Presented{Code: "ABCDEF"}, opens, nil, ""},
		{"channel, right credential", access.Rule{Access: access.Channel, Secret: secret}, access.Presented{Channel: "partner-credential-0001"}, opens, nil, ""},
		{"channel, wrong credential", access.Rule{Access: access.Channel, Secret: secret}, access.Presented{Channel: "partner-credential-0002"}, opens, access.ErrDenied, "denied"},
		{"channel, none", access.Rule{Access: access.Channel, Secret: secret}, access.Presented{}, opens, access.ErrDenied, "denied"},
		{"channel pool before its window", access.Rule{Access: access.Channel, Secret: secret, OpensAt: opens}, access.Presented{Channel: "x"}, opens.Add(-1), access.ErrNotOpen, "not-open"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := access.Check(c.rule, c.p, c.at)
			if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
				t.Fatalf("Check = %v, want %v", err, c.want)
			}
			var r *access.Refusal
			if c.want != nil && (!errors.As(err, &r) || r.Reason != c.reason || r.Detail == "") {
				t.Errorf("refusal %+v, want reason %q and a detail", r, c.reason)
			}
		})
	}
	var r *access.Refusal
	if errors.As(access.Check(window, access.Presented{}, opens.Add(-time.Hour)), &r) && !strings.Contains(r.Detail, "2026-12-01T10:00:00Z") {
		t.Errorf("not-open detail %q does not say when it opens", r.Detail)
	}
}

func TestRuleValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		rule access.Rule
		ok   bool
	}{
		{"open", access.Rule{}, true},
		{"window", access.Rule{OpensAt: opens, ClosesAt: closes}, true},
		{"unknown access", access.Rule{Access: "vip"}, false},
		{"channel without a secret", access.Rule{Access: access.Channel}, false},
		{"secret without a channel", access.Rule{Access: access.Code, Secret: secret}, false},
		{"closes before it opens", access.Rule{OpensAt: closes, ClosesAt: opens}, false},
		{"closes as it opens", access.Rule{OpensAt: opens, ClosesAt: opens}, false},
		{"before 1970", access.Rule{OpensAt: time.Unix(-10, 0)}, false},
	} {
		err := c.rule.Validate()
		if (err == nil) != c.ok || err != nil && !errors.Is(err, stock.ErrInvalid) {
			t.Errorf("%s: Validate = %v, want ok %v (invalid matching stock.ErrInvalid)", c.name, err, c.ok)
		}
	}
}

func TestCodes(t *testing.T) {
	for code, ok := range map[string]bool{
		"ABCDEF": true, "abc_-9": true, strings.Repeat("a", 64): true,
		"ABCDE": false, strings.Repeat("a", 65): false, "ABC DEF": false, "ABCDÉF": false, "AB{1}CD": false, "": false,
	} {
		if err := access.CheckCode(code); (err == nil) != ok {
			t.Errorf("CheckCode(%q) = %v, want ok %v", code, err, ok)
		}
	}
	for n, ok := range map[int64]bool{0: false, 1: true, access.MaxCodeUses: true, access.MaxCodeUses + 1: false, -1: false} {
		if err := access.CheckUses(n); (err == nil) != ok {
			t.Errorf("CheckUses(%d) = %v, want ok %v", n, err, ok)
		}
	}
	if err := access.CheckChannel("short"); err == nil || err.Error() != "a channel pool's credential has at least 16 characters" {
		t.Errorf("CheckChannel(short) = %v, want the detail alone", err)
	}
	t0 := stock.SKU{Program: keys.MustID("p"), Ticket: keys.MustID("t")}
	a, b := t0.InPool(keys.MustID("fans")), t0.InPool(keys.MustID("press"))
	if h1, h2 := access.CodeHash(a, "ABCDEF"), access.CodeHash(a, "ABCDEF"); h1 == access.CodeHash(b, "ABCDEF") || h1 != h2 {
		t.Error("one code text in two pools must be two codes, and the same code the same hash")
	}
	ann, bob := keys.MustID("ann"), keys.MustID("bob")
	for _, c := range []struct {
		max       int64
		only, who keys.ID
		lets      bool
	}{{1, keys.ID{}, ann, true}, {0, keys.ID{}, ann, false}, {5, ann, ann, true}, {5, ann, bob, false}} {
		if got := access.CodeLets(c.max, c.only, c.who); got != c.lets {
			t.Errorf("CodeLets(%d, %q, %q) = %v", c.max, c.only, c.who, got)
		}
	}
}

// The same key with another credential is another request; a request
// presenting nothing keeps the fingerprint it always had.
func TestFields(t *testing.T) {
	base := []string{"p", "t", "1"}
	if got := (access.Presented{}).Fields(base...); !slices.Equal(got, base) {
		t.Errorf("nothing presented: %v, want %v", got, base)
	}
	x := access.Presented{Code: "ABCDEF"}.Fields(base...)
	y := access.Presented{Code: "ABCDEG"}.Fields(base...)
	if slices.Equal(x, y) || slices.Contains(x, "ABCDEF") {
		t.Errorf("fields %v / %v: two codes must differ, and no code is kept in clear", x, y)
	}
}
