package webhook_test

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stockgate/stockgate/client/webhook"
)

// The Standard Webhooks reference vector: a receiver using any library of
// the convention verifies stockgate's deliveries.
func TestReferenceVector(t *testing.T) {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	at := time.Unix(1614265330, 0)
	s, err := webhook.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	s.Sign(h, "msg_p5jXN8AQM9LWM0D4loKWxJek", []byte(`{"test": 2432232314}`), at)
	if got := h.Get(webhook.HeaderSignature); got != "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=" {
		t.Errorf("signature %s, want the reference", got)
	}
	v, err := webhook.NewVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Verify(h, []byte(`{"test": 2432232314}`), at.Add(time.Minute)); err != nil {
		t.Errorf("verify the reference: %v", err)
	}
}

// A delivery verifies under its secret (or a rotated one beside it), and
// every tampering is refused with the check it failed.
func TestVerifyRefusesTampering(t *testing.T) {
	old, cur := webhook.NewSecret(), webhook.NewSecret()
	now := time.Now()
	body := []byte(`{"type":"order.created","id":"e1"}`)
	signed := func(secret, id string, at time.Time) http.Header {
		s, err := webhook.NewSigner(secret)
		if err != nil {
			t.Fatal(err)
		}
		h := http.Header{}
		s.Sign(h, id, body, at)
		return h
	}
	v, err := webhook.NewVerifier(cur, old)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Verify(signed(old, "e1", now), body, now); err != nil {
		t.Errorf("signed with the rotated-out secret: %v", err)
	}
	two := signed(cur, "e1", now)
	two.Set(webhook.HeaderSignature, "v1,AAAA "+two.Get(webhook.HeaderSignature))
	if err := v.Verify(two, body, now); err != nil {
		t.Errorf("two signatures, the second good: %v", err)
	}
	otherID := signed(cur, "e1", now)
	otherID.Set(webhook.HeaderID, "e2")
	otherTS := signed(cur, "e1", now)
	otherTS.Set(webhook.HeaderTimestamp, "1")
	v2 := signed(cur, "e1", now)
	v2.Set(webhook.HeaderSignature, "v2,"+v2.Get(webhook.HeaderSignature)[3:])
	for _, c := range []struct {
		name string
		h    http.Header
		body []byte
		now  time.Time
		want error
	}{
		{"another body", signed(cur, "e1", now), []byte(`{"type":"order.refunded","id":"e1"}`), now, webhook.ErrSignature},
		{"another secret", signed(webhook.NewSecret(), "e1", now), body, now, webhook.ErrSignature},
		{"another id", otherID, body, now, webhook.ErrSignature},
		{"an old timestamp", otherTS, body, now, webhook.ErrTimestamp},
		{"replayed six minutes on", signed(cur, "e1", now), body, now.Add(6 * time.Minute), webhook.ErrTimestamp},
		{"from the future", signed(cur, "e1", now.Add(10*time.Minute)), body, now, webhook.ErrTimestamp},
		{"another scheme", v2, body, now, webhook.ErrSignature},
		{"no headers", http.Header{}, body, now, webhook.ErrMissing},
	} {
		if err := v.Verify(c.h, c.body, c.now); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	for _, bad := range []string{"", "secret", "whsec_", "whsec_!!!", "whsec_c2hvcnQ="} {
		if _, err := webhook.NewSigner(bad); !errors.Is(err, webhook.ErrSecret) {
			t.Errorf("secret %q: %v, want ErrSecret", bad, err)
		}
	}
	if _, err := webhook.NewVerifier(); !errors.Is(err, webhook.ErrSecret) {
		t.Errorf("no secrets: %v", err)
	}
}
