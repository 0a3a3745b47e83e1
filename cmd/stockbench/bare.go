package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/stockgate/stockgate/e2e/loadgen"
	"github.com/stockgate/stockgate/internal/comparators"
)

// The bare gin ceilings (a purchase or stock read answered at once, a
// waiting-room check with a fixed standing) run in a process of their own,
// as stockgate does, so that a ratio compares what the handlers do and not
// where they run. Served from the benchmark's own process, next to the
// load generator, the same bare handler answered 15–64 % more checks than in a
// process of its own (`stockbench bare where`: three interleaved rounds of
// 150,000 checks from 64 connections, run twice: 16,722 vs 12,397, 14,557 vs
// 11,244, 13,018 vs 11,370 /s; then 19,284 vs 14,170, 21,238 vs 14,205,
// 21,314 vs 12,991 /s),
// likely because one Go runtime then both writes each reply and reads it,
// with no second process to schedule on the two cores.

// bareKinds are the handlers `stockbench bare KIND` serves.
var bareKinds = map[string]func() http.Handler{
	"purchases": func() http.Handler { return comparators.Bare().Handler },
	"polls":     comparators.BarePolls,
}

// bareCmd serves one bare handler on a free loopback port with stockgate's
// HTTP server settings, prints its address, and exits when its standard
// input closes (its parent stopped it or is gone). `bare where` instead
// measures the checks of the bare handler in this process and in a process
// of its own, in interleaved rounds.
func bareCmd(args []string) error {
	if len(args) == 1 && args[0] == "where" {
		return bareWhere(3, 150_000, 64)
	}
	if len(args) != 1 || bareKinds[args[0]] == nil {
		return usageError{"bare: want one of purchases, polls, where"}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: bareKinds[args[0]](), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 2 * time.Minute}
	fmt.Println(l.Addr().String())
	go func() { // owned by this process: stdin's end stops the server
		_, _ = io.Copy(io.Discard, os.Stdin)
		srv.Close()
	}()
	if err := srv.Serve(l); err != http.ErrServerClosed {
		return err
	}
	return nil
}

// serveBare starts `stockbench bare kind` as a child process and returns
// its base URL and the function that stops it.
func serveBare(kind string) (string, func(), error) {
	self, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(self, "bare", kind)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return "", nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() {
		stdin.Close()
		_ = cmd.Wait()
	}
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		stop()
		return "", nil, fmt.Errorf("bare %s: %w", kind, err)
	}
	return "http://" + strings.TrimSpace(addr), stop, nil
}

// bareWhere prints, for rounds interleaved rounds, the throughput of n
// waiting-room checks from workers connections answered by the bare handler
// in this process (beside the load generator) and in a process of its own.
func bareWhere(rounds int, n, workers uint64) error {
	sc := loadgen.QueuePolls("p", []string{"t1", "t2", "t3"}, n)
	for r := range rounds {
		inBase, inStop := serve(comparators.BarePolls())
		in, err := loadgen.Attack(loadgen.Run{Name: "bare in this process", BaseURL: inBase, Scenario: sc, Workers: workers})
		inStop()
		if err != nil {
			return err
		}
		apartBase, apartStop, err := serveBare("polls")
		if err != nil {
			return err
		}
		apart, err := loadgen.Attack(loadgen.Run{Name: "bare apart", BaseURL: apartBase, Scenario: sc, Workers: workers})
		apartStop()
		if err != nil {
			return err
		}
		fmt.Printf("round %d: in this process %.0f /s, in its own %.0f /s (in this process %+.0f %%)\n",
			r+1, in.Throughput(), apart.Throughput(), 100*(in.Throughput()/apart.Throughput()-1))
	}
	return nil
}
