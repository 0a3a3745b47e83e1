package client_test

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stockgate/stockgate/client"
)

// TestKeyIsNeverAPlainString reads the package's own source: every
// exported method of *Client that takes an Idempotency-Key takes it as a
// Key, so a key and a buyer (both strings before) can't be swapped in a
// call without a compile error.
func TestKeyIsNeverAPlainString(t *testing.T) {
	pkgs, err := parser.ParseDir(token.NewFileSet(), ".", func(fi fs.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	keyed := 0
	for _, f := range pkgs["client"].Files {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil {
				continue
			}
			for _, field := range fn.Type.Params.List {
				typ, _ := field.Type.(*ast.Ident)
				for _, name := range field.Names {
					if name.Name != "key" {
						continue
					}
					keyed++
					if typ == nil || typ.Name != "Key" {
						t.Errorf("%s takes its key as %v, want Key", fn.Name.Name, field.Type)
					}
				}
			}
		}
	}
	if keyed < 20 {
		t.Fatalf("found %d methods taking a key: the source was not read as expected", keyed)
	}
}

// TestNewKeyIsFreshEachTime: two keys never collide (a collision would
// replay another request's answer).
func TestNewKeyIsFreshEachTime(t *testing.T) {
	seen := map[client.Key]bool{}
	for range 1000 {
		k := client.NewKey()
		if len(k) != 32 || seen[k] {
			t.Fatalf("NewKey() = %q (len %d, seen before: %v)", k, len(k), seen[k])
		}
		seen[k] = true
	}
}

// TestAdmittedAndForDeviceAreCopies: the admission token and the
// fingerprint go out on the derived Client's requests only, never on the
// Client it came from, however the two are used at once.
func TestAdmittedAndForDeviceAreCopies(t *testing.T) {
	var mu sync.Mutex
	got := map[string][2]string{} // key: admission, fingerprint
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got[r.Header.Get("Idempotency-Key")] = [2]string{r.Header.Get("Admission-Token"), r.Header.Get("Buyer-Fingerprint")}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"order_id":"o","quantity":1}`))
	}))
	defer gw.Close()
	c, err := client.New(client.Options{BaseURL: gw.URL})
	if err != nil {
		t.Fatal(err)
	}
	sku := client.SKU{Program: "p", Ticket: "t"}
	ctx := context.Background()
	admitted := c.Admitted("adm-1")
	both := admitted.ForDevice("phone-1")
	var wg sync.WaitGroup
	for _, call := range []struct {
		c   *client.Client
		key client.Key
	}{{c, "plain"}, {admitted, "admitted"}, {both, "both"}, {c.ForDevice("tablet-2"), "device"}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := call.c.Purchase(ctx, sku, call.key, "ann", 1); err != nil {
				t.Errorf("%s: %v", call.key, err)
			}
		}()
	}
	wg.Wait()
	want := map[string][2]string{"plain": {}, "admitted": {"adm-1", ""}, "both": {"adm-1", "phone-1"}, "device": {"", "tablet-2"}}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: sent admission %q, fingerprint %q; want %q, %q", k, got[k][0], got[k][1], w[0], w[1])
		}
	}
}
