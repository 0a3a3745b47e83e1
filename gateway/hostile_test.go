package gateway_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stockgate/stockgate/gateway"
	"github.com/stockgate/stockgate/sale"
)

// Hostile requests the HTTP layer answers before the service is asked
// (helper-35's probe of a running gateway): each a problem+json with its
// 4xx, none a hang, a redirect or a request read as something else.

func hostileServer(t *testing.T) *httptest.Server {
	t.Helper()
	srv, err := gateway.New(gateway.Options{Sale: new(sale.Service), BodyTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return ts
}

// raw sends text on a connection of its own and returns the first answer's
// status line and headers, read within 5 s.
func raw(t *testing.T, ts *httptest.Server, text string) string {
	t.Helper()
	conn, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, text); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(conn)
	var head strings.Builder
	for {
		line, err := r.ReadString('\n')
		head.WriteString(line)
		if err != nil || line == "\r\n" {
			return head.String()
		}
	}
}

// closes sends text on a connection of its own and reports whether the
// server answered and closed it within 5 s (the status line, then EOF, or
// a reset: closed with the client's bytes unread).
func closes(t *testing.T, ts *httptest.Server, text string) (string, bool) {
	t.Helper()
	conn, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, text); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	all, err := io.ReadAll(conn)
	status, _, _ := strings.Cut(string(all), "\r\n")
	return status, !errors.Is(err, os.ErrDeadlineExceeded)
}

// A body that stops part-way, answered 408 or 413: the answer comes and
// the connection ends, rather than net/http reading the rest of the body,
// with no deadline, when it closes it (helper-40).
func TestStalledBodiesEndTheirConnection(t *testing.T) {
	ts := hostileServer(t)
	put := "PUT /v1/admin/skus/p1/ga HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
	for _, tc := range []struct{ name, request, status string }{
		{"408", put + "Content-Length: 100\r\n\r\n{\"total\":", "408"},
		{"413 chunked", put + "Transfer-Encoding: chunked\r\n\r\n2000\r\n" + strings.Repeat(" ", 0x2000) + "\r\n10\r\n", "413"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, closed := closes(t, ts, tc.request)
			if !strings.Contains(status, " "+tc.status+" ") || !closed {
				t.Errorf("answered %q, connection closed within 5 s: %v; want %s and closed", status, closed, tc.status)
			}
		})
	}
}

func TestHostileRequestsAnsweredAtTheDoor(t *testing.T) {
	ts := hostileServer(t)
	put := "PUT /v1/admin/skus/p1/ga HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
	for _, tc := range []struct {
		name, request, status, problem string
	}{
		// It hung until the client gave up (70 s seen): only the headers
		// had a deadline.
		{"a body that stops coming", put + "Content-Length: 100\r\n\r\n{\"total\":", "408", "body-timeout"},
		// "100 Continue", then a wait for 100 MB the server would refuse.
		{"a body too large, announced", put + "Expect: 100-continue\r\nContent-Length: 100000000\r\n\r\n", "413", "body-too-large"},
		// Refused before the body is read, with the body stalled: net/http
		// read the rest of it first, with no deadline (helper-38).
		{"a body too large, stalled", put + "Content-Length: 100000\r\n\r\n{\"total\":", "413", "body-too-large"},
		{"a wrong content type, stalled", "PUT /v1/admin/skus/p1/ga HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n" +
			"Content-Length: 100\r\n\r\n{", "415", "unsupported-media-type"},
		{"no route, stalled", "POST /v1/nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{", "404", "not-found"},
		// A JSON null was read as {}.
		{"a null body", put + "Content-Length: 4\r\n\r\nnull", "400", "malformed-json"},
		// A time that is not RFC 3339 was "malformed JSON", a 400 that
		// told the client nothing of which value (helper-67 #10).
		{"a time that is no time", "PUT /v1/admin/skus/p1/ga/pools/fan HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
			"Content-Length: 41\r\n\r\n{\"allotment\":1,\"opens_at\":\"next tuesday\"}", "422", "invalid-field"},
		{"a time that is a number", "PUT /v1/admin/skus/p1/ga/pools/fan HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
			"Content-Length: 31\r\n\r\n{\"allotment\":1,\"opens_at\":1700}", "422", "invalid-field"},
		// An empty value read as absent: a code pool opened to everyone,
		// a SKU's resale mode kept (helper-106 #3).
		{"an empty access", "PUT /v1/admin/skus/p1/ga/pools/fan HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
			"Content-Length: 27\r\n\r\n{\"allotment\":1,\"access\":\"\"}", "422", "invalid-field"},
		{"an empty resale mode", put + "Content-Length: 23\r\n\r\n{\"total\":1,\"resale\":\"\"}", "422", "invalid-field"},
		// Two keys name two requests; the first one won.
		{"two idempotency keys", "POST /v1/skus/p1/ga/purchases HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
			"Idempotency-Key: k1\r\nIdempotency-Key: k2\r\nContent-Length: 2\r\n\r\n{}", "400", "invalid-idempotency-key"},
		// A route that takes no body acted whatever body came: a sale
		// ended, a buyer left the line (helper-110).
		{"a body of another type on a route with none", "POST /v1/admin/skus/p1/ga/end HTTP/1.1\r\nHost: x\r\nContent-Type: text/xml\r\n" +
			"Content-Length: 3\r\n\r\n<a>", "415", "unsupported-media-type"},
		{"a member on a route with no body", "DELETE /v1/skus/p1/ga/waitlist/ann HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
			"Content-Length: 7\r\n\r\n{\"x\":1}", "400", "malformed-json"},
		{"garbage on a route with no body", "POST /v1/admin/skus/p1/ga/pools/fan/close HTTP/1.1\r\nHost: x\r\n" +
			"Content-Length: 7\r\n\r\ngarbage", "400", "malformed-json"},
		{"a body too large on a route with none", "POST /v1/admin/skus/p1/ga/reconcile HTTP/1.1\r\nHost: x\r\n" +
			"Content-Length: 100000\r\n\r\n{", "413", "body-too-large"},
		// The first one counted against the hold budget, or spent the
		// admission (helper-106).
		{"two fingerprints", "POST /v1/skus/p1/ga/holds HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
			"Idempotency-Key: k1\r\nBuyer-Fingerprint: d1\r\nBuyer-Fingerprint: d2\r\nContent-Length: 2\r\n\r\n{}", "422", "invalid-field"},
		{"two admission tokens", "POST /v1/skus/p1/ga/purchases HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
			"Idempotency-Key: k1\r\nAdmission-Token: a\r\nAdmission-Token: b\r\nContent-Length: 2\r\n\r\n{}", "422", "invalid-field"},
		// gin's reader dropped the pair: read as no pool (helper-106).
		{"a query with a ;", "GET /v1/skus/p1/ga/stock?pool=fan;x HTTP/1.1\r\nHost: x\r\n\r\n", "400", "invalid-id"},
		{"a query with a bad escape", "POST /v1/skus/p1/ga/purchases?pool=%zz HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
			"Idempotency-Key: k1\r\nContent-Length: 2\r\n\r\n{}", "400", "invalid-id"},
		// 301/307 to the path without the slash, as HTML.
		{"a trailing slash", "GET /v1/orders/abc/ HTTP/1.1\r\nHost: x\r\n\r\n", "404", "not-found"},
		{"a trailing slash on a write", "POST /v1/skus/p1/ga/purchases/ HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", "404", "not-found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			head := raw(t, ts, tc.request)
			if !strings.HasPrefix(head, "HTTP/1.1 "+tc.status+" ") || !strings.Contains(head, "application/problem+json") {
				t.Errorf("%q answered\n%s\nwant %s problem+json (%s)", tc.request, head, tc.status, tc.problem)
			}
		})
	}
	// The problem's type, read whole once.
	r, err := http.Get(ts.URL + "/v1/orders/abc/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if !strings.Contains(string(b), "/problems/not-found") {
		t.Errorf("trailing slash: %d %s", r.StatusCode, b)
	}
}

// HEAD is answered wherever GET is, with the GET's status and headers and
// no body (RFC 9110 9.3.2); it was 405, which a load balancer's HEAD
// health check reads as down (helper-106).
func TestHeadIsGetWithoutItsBody(t *testing.T) {
	ts := hostileServer(t)
	for _, tc := range []struct {
		path   string
		status int
		ctype  string
	}{
		{"/livez", http.StatusOK, "text/plain"},
		{"/openapi.json", http.StatusOK, "application/json"},
		{"/v1/orders/a%7Bb", http.StatusBadRequest, "application/problem+json"},
	} {
		r, err := http.Head(ts.URL + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != tc.status || !strings.HasPrefix(r.Header.Get("Content-Type"), tc.ctype) || len(b) != 0 {
			t.Errorf("HEAD %s = %d %q with %d bytes of body; want %d %s and none", tc.path, r.StatusCode, r.Header.Get("Content-Type"), len(b), tc.status, tc.ctype)
		}
	}
	// A route with no GET is still 405 to a HEAD.
	head := raw(t, ts, "HEAD /v1/skus/p1/ga/purchases HTTP/1.1\r\nHost: x\r\n\r\n")
	if !strings.HasPrefix(head, "HTTP/1.1 405 ") {
		t.Errorf("HEAD of a POST route answered\n%s\nwant 405", head)
	}
}
