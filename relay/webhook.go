package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/stockgate/stockgate/client/webhook"
	"github.com/stockgate/stockgate/internal/opt"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/tracing"
)

// WebhookOptions configures a webhook sink.
type WebhookOptions struct {
	Name   string // the sink's name; default "webhook"
	URL    string // required: http or https
	Secret string // required: the signing secret (webhook.NewSecret's form)
	// Client sends the deliveries. Default: a client that follows no
	// redirects (a 3xx is a failed attempt, not a delivery elsewhere).
	Client *http.Client
	// Now is the clock of the webhook-timestamp. Default time.Now.
	Now func() time.Time
}

// Validate reports the first field that cannot work (an *opt.Error).
func (o WebhookOptions) Validate() error {
	u, err := url.Parse(o.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return opt.Bad("URL", "must be an http or https URL")
	}
	if _, err := webhook.NewSigner(o.Secret); err != nil {
		return opt.Bad("Secret", "must be whsec_ and base64 of at least 24 bytes")
	}
	return nil
}

// Webhook delivers events as signed HTTP POSTs (Standard Webhooks): the
// body is the event's JSON, webhook-id its id. A 2xx answer is a delivery;
// anything else, or no answer in time, a failed attempt.
type Webhook struct {
	name   string
	url    string
	signer *webhook.Signer
	client *http.Client
	now    func() time.Time
}

// NewWebhook returns a webhook sink.
func NewWebhook(o WebhookOptions) (*Webhook, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("relay: webhook: %w", err)
	}
	signer, _ := webhook.NewSigner(o.Secret)
	if o.Client == nil {
		o.Client = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Name == "" {
		o.Name = "webhook"
	}
	return &Webhook{name: o.Name, url: o.URL, signer: signer, client: o.Client, now: o.Now}, nil
}

// Name is the sink's name.
func (w *Webhook) Name() string { return w.name }

// Deliver posts e. With tracing on, each attempt is a span of the trace of
// the request whose change wrote e (a root of its own for a sweeper's
// event), and its traceparent goes out with the request, so the
// receiver's trace joins the purchase's.
func (w *Webhook) Deliver(ctx context.Context, e ledger.Event) (err error) {
	ctx, span := deliverySpan(ctx, "webhook.deliver", w.name, e)
	defer func() { tracing.End(span, err) }()
	body, err := json.Marshal(e.Wire())
	if err != nil {
		return fmt.Errorf("webhook: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("webhook: %w", err)
	}
	tracing.Inject(ctx, req.Header)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "stockgate-relay")
	w.signer.Sign(req.Header, e.ID.String(), body, w.now())
	resp, err := w.client.Do(req)
	if err != nil {
		return fmt.Errorf("webhook: %w", err)
	}
	defer resp.Body.Close()
	// Read a little, so the connection is reused; the rest is dropped.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10)) // best effort: the status decides
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("webhook: answered %s", resp.Status)
	}
	return nil
}

// deliverySpan starts the span of one delivery attempt of e to a sink: a
// span of the trace of the request whose change wrote e (a root of its
// own for a sweeper's event).
func deliverySpan(ctx context.Context, name, sink string, e ledger.Event) (context.Context, trace.Span) {
	ctx, span := tracing.StartClient(tracing.WithParent(ctx, e.Trace), name)
	if span.IsRecording() {
		span.SetAttributes(attribute.String("stockgate.sink", sink), attribute.String("stockgate.event.id", e.ID.String()),
			attribute.String("stockgate.event.type", e.Type), attribute.Int64("stockgate.event.seq", e.Seq))
	}
	return ctx, span
}
