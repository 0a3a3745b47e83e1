package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode"

	"github.com/gin-gonic/gin"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/stock"
)

// FuzzDecodePurchase: whatever the body, decoding never panics, and a body
// it accepts is one JSON object with known members, none twice, that
// encoding/json reads to the same values.
func FuzzDecodePurchase(f *testing.F) {
	for _, seed := range []string{
		`{"buyer":"alice","quantity":2}`, `{"buyer":"a","quantity":1,"quantity":5}`, `{"buyer":"a","quantity":1.5}`,
		`{"buyer":"a"} {}`, `{"buyer":"a","extra":1}`, `[]`, `{"buyer":{"x":1,"x":2}}`, `{"quantity":9223372036854775808}`,
		"\x00", `{"buyer":"a","quantity":1}` + strings.Repeat(" ", 5000),
		`{"a":{"b":1,"B":2}}`, `{"s":1,"\u017f":2}`, `{"k":1,"\u212a":2}`, `{"x":[{"id":"a"},{"id":"b"}]}`,
		`{"q\"":1,"q\u0022":2}`, `{"buyer" : "a" ,"BUYER":"b"}`,
	} {
		f.Add([]byte(seed))
	}
	gin.SetMode(gin.ReleaseMode)
	s := &Server{opts: Options{MaxBodyBytes: 4 << 10}}
	f.Fuzz(func(t *testing.T, body []byte) {
		c, _ := gin.CreateTestContext(httptest.NewRecorder())
		c.Request = httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
		c.Request.Header.Set("Content-Type", "application/json")
		if json.Valid(body) && (duplicateMember(body) == nil) != (duplicateByTokens(body) == nil) {
			t.Fatalf("duplicateMember(%q) = %v, the token reference says %v", body, duplicateMember(body), duplicateByTokens(body))
		}
		var got purchaseBody
		if !s.decodeBody(c, &got) {
			if c.Writer.Status() < 400 || c.Writer.Status() >= 500 {
				t.Fatalf("refused body %q answered %d, want a 4xx", body, c.Writer.Status())
			}
			return
		}
		if err := duplicateByTokens(body); err != nil {
			t.Fatalf("accepted %q with a member twice: %v", body, err)
		}
		var plain purchaseBody
		if err := json.Unmarshal(body, &plain); err != nil {
			t.Fatalf("accepted %q that encoding/json refuses: %v", body, err)
		}
		if plain.Buyer != got.Buyer || (plain.Quantity == nil) != (got.Quantity == nil) ||
			(plain.Quantity != nil && *plain.Quantity != *got.Quantity) {
			t.Fatalf("accepted %q as %+v; encoding/json reads %+v", body, got, plain)
		}
	})
}

// duplicateByTokens is the slow reference of duplicateMember: encoding/json's
// own tokens, names folded as it matches them.
func duplicateByTokens(raw []byte) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	type frame struct {
		object bool
		seen   map[string]bool
		key    bool
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch t := tok.(type) {
		case json.Delim:
			if t == '{' || t == '[' {
				if top != nil && top.object {
					top.key = true
				}
				stack = append(stack, &frame{object: t == '{', seen: map[string]bool{}, key: t == '{'})
			} else {
				stack = stack[:len(stack)-1]
			}
			continue
		case string:
			if top != nil && top.object && top.key {
				if top.seen[foldName(t)] {
					return fmt.Errorf("member %q twice", t)
				}
				top.seen[foldName(t)], top.key = true, false
				continue
			}
		}
		if top != nil && top.object {
			top.key = true
		}
	}
}

// FuzzIdempotencyKey: a key is accepted only if it (or the quoted string
// inside) is a valid id, and then it is that id.
func FuzzIdempotencyKey(f *testing.F) {
	for _, seed := range []string{"order-1", `"order-1"`, `"`, `""`, `"a"b"`, "a{b}", strings.Repeat("k", 65), ""} {
		f.Add(seed)
	}
	gin.SetMode(gin.ReleaseMode)
	f.Fuzz(func(t *testing.T, header string) {
		c, _ := gin.CreateTestContext(httptest.NewRecorder())
		c.Request = httptest.NewRequest(http.MethodPost, "/", nil)
		c.Request.Header["Idempotency-Key"] = []string{header}
		key, ok := idempotencyKey(c)
		if !ok {
			if c.Writer.Status() != http.StatusBadRequest {
				t.Fatalf("refused %q with %d, want 400", header, c.Writer.Status())
			}
			return
		}
		if key.IsZero() || (key.String() != header && `"`+key.String()+`"` != header) {
			t.Fatalf("accepted %q as %q", header, key)
		}
		if id := sale.PurchaseGateID(sale.Ask{Buyer: keys.MustID("b"), Key: key}, stock.SKU{Program: keys.MustID("p"), Ticket: keys.MustID("t")}, 1); keys.CheckID(id.String()) != nil {
			t.Fatalf("gate id %q of key %q is not a valid id", id, key)
		}
	})
}

// foldName maps every rune to the smallest of its Unicode case-folding
// orbit, so two names encoding/json would match map to one string (this
// covers its special cases too: the Kelvin sign and the long s).
func foldName(name string) string {
	b := make([]rune, 0, len(name))
	for _, r := range name {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		b = append(b, least)
	}
	return string(b)
}
