package waitroom_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/stockgate/stockgate/e2e/powpage"
	"github.com/stockgate/stockgate/e2e/systest"
)

// The waiting room's page in a real browser (headless Chromium, which
// make test installs): it joins the line, shows the place and the buyers
// ahead while the room admits no one, then, once admitted, sends the
// buyer to the program's checkout URL with an admission token that buys.
// STOCKGATE_QUEUE_SHOTS=<dir> writes the waiting and admitted screens
// there (the README's pictures).
func TestQueuePageInABrowser(t *testing.T) {
	chrome, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium not found: run `make test` (it installs Debian's chromium) or install it yourself")
	}
	e := systest.Start(t, systest.Options{Driver: "sqlite", Pacer: true})
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 10, 1, 4)
	got := make(chan url.Values, 1)
	checkout := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case got <- r.URL.Query():
		default:
		}
		fmt.Fprint(w, "<html><body><h1>Checkout</h1></body></html>")
	}))
	t.Cleanup(checkout.Close)
	putQueue := func(perRemaining string) {
		t.Helper()
		body := fmt.Sprintf(`{"opens_in_seconds":0,"rate_per_second":50,"window_seconds":60,"per_remaining":%s,"checkout_url":%q}`,
			perRemaining, checkout.URL+"/checkout?from=queue")
		if r := e.Do(t, http.MethodPut, "/v1/admin/programs/"+sku.Program.String()+"/queue", nil, body); r.Status != http.StatusOK {
			t.Fatalf("PUT queue = %d %s", r.Status, r.Body)
		}
	}
	putQueue("0.001") // 10 tickets x 0.001, rounded up: one buyer admitted, then nobody
	for i := range 3 {
		if r, _ := queueJoin(t, e, sku.Program, fmt.Sprintf("early%d", i)); r.Status != http.StatusCreated {
			t.Fatalf("join = %d %s", r.Status, r.Body)
		}
	}
	admitted(t, e, sku.Program, "early0")

	alloc, cancel := chromedp.NewExecAllocator(t.Context(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.Headless, chromedp.WindowSize(900, 640))...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(alloc)
	defer cancel()
	ctx, cancel = context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	shots := os.Getenv("STOCKGATE_QUEUE_SHOTS")
	shot := func(name string) chromedp.Action[chromedp.Void] {
		return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
			if shots == "" {
				return chromedp.Void{}, nil
			}
			buf, err := chromedp.FullScreenshot(100)(ctx, tg)
			if err != nil {
				return chromedp.Void{}, err
			}
			return chromedp.Void{}, os.WriteFile(filepath.Join(shots, name), buf, 0o644)
		}
	}
	if err := chromedp.Do(ctx,
		chromedp.Navigate(e.URL+"/queue/"+sku.Program.String()+"?buyer=web1"),
		chromedp.WaitVisible(chromedp.CSS(`main[data-state="waiting"] #position`)),
	); err != nil {
		t.Fatalf("the waiting screen: %v", err)
	}
	position, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#position`)))
	if err != nil {
		t.Fatal(err)
	}
	ahead, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#ahead`)))
	if err != nil {
		t.Fatal(err)
	}
	if position != "4" || ahead != "2" {
		t.Fatalf("the page shows place %q with %q ahead, want 4 and 2", position, ahead)
	}
	if err := chromedp.Do(ctx, shot("queue-waiting.png")); err != nil {
		t.Fatal(err)
	}
	putQueue("10") // now everyone may come in
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`main[data-state="admitted"]`)), shot("queue-admitted.png")); err != nil {
		t.Fatalf("the admitted screen: %v", err)
	}
	var q url.Values
	select {
	case q = <-got:
	case <-ctx.Done():
		t.Fatal("the page never sent the buyer to checkout")
	}
	if q.Get("buyer") != "web1" || q.Get("from") != "queue" || q.Get("admission_token") == "" {
		t.Fatalf("checkout got %v", q)
	}
	if r := buyAdmitted(t, e, sku, "web1-order", "web1", q.Get("admission_token")); r.Status != http.StatusCreated {
		t.Fatalf("purchase with the page's token = %d %s", r.Status, r.Body)
	}

	// A room that asks for proof of work: the page solves the puzzle in its
	// web worker and takes its place; the solve time is this browser's.
	pow := systest.NewSKU(t)
	e.PutSKU(t, pow, 10, 1, 4)
	if r := e.Do(t, http.MethodPut, "/v1/admin/programs/"+pow.Program.String()+"/queue", nil,
		`{"opens_in_seconds":0,"rate_per_second":50,"window_seconds":60,"per_remaining":1,"proof_of_work_bits":18}`); r.Status != http.StatusOK {
		t.Fatalf("PUT queue = %d %s", r.Status, r.Body)
	}
	// Then in a browser slowed as a phone-class core (a quarter of one
	// core here): the worker must feel it, or the figure would be this
	// machine's. Three buyers each, compared by their fastest rate: a
	// short solve is mostly the worker's warming up.
	phone, stop, err := powpage.Browser(t.Context(), chrome, powpage.PhoneSlowdown)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	phone, cancel = context.WithTimeout(phone, 3*time.Minute)
	defer cancel()
	var best [2]float64
	for k, b := range []struct {
		ctx  context.Context
		what string
	}{{ctx, "this machine's core"}, {phone, fmt.Sprintf("a core %d times slower", powpage.PhoneSlowdown)}} {
		for i := range 3 {
			s, err := powpage.Join(b.ctx, e.URL, pow.Program.String(), fmt.Sprintf("web%d-%d", k, i))
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("proof of work, 18 bits, in headless Chromium's web worker on %s: %v, %d tries (%.0f a second)",
				b.what, s.Took.Round(time.Millisecond), s.Tries, s.Rate())
			best[k] = max(best[k], s.Rate())
		}
	}
	if best[1] > best[0]/2 {
		t.Errorf("the worker tried at most %.0f hashes a second slowed %d times and %.0f unslowed: the slowdown did not reach it",
			best[1], powpage.PhoneSlowdown, best[0])
	}
	if v := getRoom(t, e, pow.Program); v.Joined != 6 {
		t.Fatalf("joined %d, want the pages' six buyers", v.Joined)
	}

	// The page of a program with no waiting room is a problem, not a page.
	if r := e.Do(t, http.MethodGet, "/queue/no-such-program", nil, ""); r.Status != http.StatusNotFound {
		t.Fatalf("page of no queue = %d %s", r.Status, r.Body)
	}
}
