package client_test

import (
	"testing"
	"time"

	"github.com/stockgate/stockgate/client"
)

func TestOptionsValidate(t *testing.T) {
	for _, o := range []client.Options{{}, {BaseURL: "gate.example"}, {BaseURL: "ftp://x"}, {BaseURL: "http://x", Attempts: -1},
		{BaseURL: "http://x", MaxWait: -time.Second}} {
		if _, err := client.New(o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
}
