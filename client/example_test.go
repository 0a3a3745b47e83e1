package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/stockgate/stockgate/client"
)

// gateway stands in for a stockgate gateway in the examples, answering
// as the real one does (the OpenAPI document's shapes); the client's
// tests against a real gateway are in the server's module
// (internal/clienttest).
func gateway() *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		answer := func(status int, json string) {
			ct := "application/json"
			if status >= 400 {
				ct = "application/problem+json"
			}
			w.Header().Set("Content-Type", ct)
			w.WriteHeader(status)
			_, _ = io.WriteString(w, json)
		}
		key := r.Header.Get("Idempotency-Key")
		switch {
		case r.URL.Path == "/v1/skus/show-1/ga/purchases" && key == "order-1":
			answer(http.StatusCreated, `{"order_id":"ord_1","program":"show-1","ticket":"ga","buyer":"alice","quantity":2,"created_at":"2026-11-24T10:00:00Z"}`)
		case r.URL.Path == "/v1/skus/show-1/ga/purchases" && key == "order-2":
			answer(http.StatusConflict, `{"type":"https://stockgate.dev/problems/sold-out","title":"Conflict","status":409,"detail":"not enough stock left for this quantity"}`)
		case r.URL.Path == "/v1/programs/show-2/queue" && strings.Contains(string(body), `"buyer":"bob"`):
			answer(http.StatusOK, `{"program":"show-2","buyer":"bob","ticket":"qt_1","state":"waiting","position":41,"ahead":40,"estimated_wait_seconds":2,"opens_at":"2026-11-24T10:00:00Z","retry_after_seconds":1,"as_of":"2026-11-24T10:00:02.25Z"}`)
		case r.URL.Path == "/v1/programs/show-2/queue/qt_1":
			answer(http.StatusOK, `{"program":"show-2","buyer":"bob","ticket":"qt_1","state":"admitted","position":41,"estimated_wait_seconds":0,"admission_token":"adm_1","opens_at":"2026-11-24T10:00:00Z","as_of":"2026-11-24T10:00:03.5Z"}`)
		case r.URL.Path == "/v1/skus/show-2/ga/purchases" && r.Header.Get("Admission-Token") == "adm_1":
			answer(http.StatusCreated, `{"order_id":"ord_2","program":"show-2","ticket":"ga","buyer":"bob","quantity":1,"created_at":"2026-11-24T10:00:03Z"}`)
		case r.URL.Path == "/v1/skus/show-2/ga/purchases":
			answer(http.StatusForbidden, `{"type":"https://stockgate.dev/problems/admission-required","title":"Forbidden","status":403}`)
		default:
			answer(http.StatusNotFound, `{"type":"https://stockgate.dev/problems/not-found","title":"Not Found","status":404}`)
		}
	}))
}

// A purchase: the Idempotency-Key makes it safe to send again (the same
// key gets the same order, and buys nothing more).
func ExampleClient_Purchase() {
	gw := gateway()
	defer gw.Close()
	c, err := client.New(client.Options{BaseURL: gw.URL})
	if err != nil {
		panic(err)
	}
	o, err := c.Purchase(context.Background(), client.SKU{Program: "show-1", Ticket: "ga"}, "order-1", "alice", 2)
	if err != nil {
		panic(err)
	}
	fmt.Println(o.OrderID, o.Buyer, o.Quantity)
	// Output: ord_1 alice 2
}

// A refusal is an error: its kind with errors.Is, the whole problem with
// errors.As.
func ExampleClient_Purchase_soldOut() {
	gw := gateway()
	defer gw.Close()
	c, _ := client.New(client.Options{BaseURL: gw.URL})
	_, err := c.Purchase(context.Background(), client.SKU{Program: "show-1", Ticket: "ga"}, "order-2", "alice", 2)
	var p *client.Problem
	fmt.Println(errors.Is(err, client.ErrSoldOut), errors.As(err, &p) && p.Status == http.StatusConflict)
	fmt.Println(err)
	// Output:
	// true true
	// stockgate: 409 sold-out: not enough stock left for this quantity
}

// A program behind a waiting room: join, check (as Retry-After says)
// until admitted, then buy as the admitted buyer: a Client that carries
// the admission token.
func ExampleClient_Admitted() {
	gw := gateway()
	defer gw.Close()
	c, _ := client.New(client.Options{BaseURL: gw.URL})
	ctx := context.Background()
	st, err := c.JoinQueue(ctx, "show-2", "bob")
	if err != nil {
		panic(err)
	}
	fmt.Println(st.State, st.Position, st.Ahead)
	for st.State == "waiting" {
		// time.Sleep(time.Duration(st.RetryAfterSeconds) * time.Second)
		if st, err = c.CheckQueue(ctx, "show-2", st.Ticket); err != nil {
			panic(err)
		}
	}
	fmt.Println(st.State)
	sku := client.SKU{Program: "show-2", Ticket: "ga"}
	_, err = c.Purchase(ctx, sku, "order-3", "bob", 1)
	fmt.Println(errors.Is(err, client.ErrAdmissionRequired))
	o, err := c.Admitted(st.AdmissionToken).Purchase(ctx, sku, "order-3", "bob", 1)
	if err != nil {
		panic(err)
	}
	fmt.Println(o.OrderID)
	// Output:
	// waiting 41 40
	// admitted
	// true
	// ord_2
}
