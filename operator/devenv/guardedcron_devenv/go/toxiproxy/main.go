// Toxiproxy for guardedcron's tests: a real fault-injecting TCP proxy that the partition
// and chaos tests put between the guard and PostgreSQL. Upstream's own server command is a
// main package (not importable), so this is the smallest entry point that runs the
// library's API server: listen address from flags, logs as JSON lines on stdout.
package main

import (
	"flag"
	"os"
	"os/signal"
	"syscall"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

func main() {
	host := flag.String("host", "127.0.0.1", "address the HTTP API listens on")
	port := flag.String("port", "8474", "port the HTTP API listens on")
	flag.Parse()

	// Exit at once on SIGTERM: the tests stop the proxy with it and need no drain.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		os.Exit(0)
	}()

	logger := zerolog.New(os.Stdout).With().Timestamp().Logger()
	metrics := toxiproxy.NewMetricsContainer(prometheus.NewRegistry())
	server := toxiproxy.NewServer(metrics, logger)
	server.Listen(*host, *port)
}
