// Command httpd is the e2e suite's server image. It listens on $PORT (8080)
// on every address, IPv4 and IPv6, and answers:
//
//	GET  /          "hostname=<name> ips=<pod addresses>\n"
//	GET  /bytes?n=N N bytes (for timed transfers out of the pod)
//	POST /sink      reads the whole body, answers "received=N\n" (transfers into the pod)
//
// It exits 0 on SIGTERM. Static, no dependencies beyond the standard library.
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func podIPs() string {
	var out []string
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.IsLoopback() || ipn.IP.IsLinkLocalUnicast() {
			continue
		}
		out = append(out, ipn.IP.String())
	}
	return strings.Join(out, ",")
}

func root(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/" {
		http.NotFound(w, r)
		return
	}
	host, _ := os.Hostname()
	fmt.Fprintf(w, "hostname=%s ips=%s client=%s\n", host, podIPs(), r.RemoteAddr)
}

var chunk = make([]byte, 64<<10)

func bytesHandler(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
	if err != nil || n < 0 || n > 1<<34 {
		http.Error(w, "n: want a byte count", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	for n > 0 {
		c := int64(len(chunk))
		if n < c {
			c = n
		}
		if _, err := w.Write(chunk[:c]); err != nil {
			return
		}
		n -= c
	}
}

func sink(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost && r.Method != http.MethodPut {
		http.Error(w, "POST a body", http.StatusMethodNotAllowed)
		return
	}
	n, err := io.Copy(io.Discard, r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	fmt.Fprintf(w, "received=%d\n", n)
}

func main() {
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", root)
	mux.HandleFunc("/bytes", bytesHandler)
	mux.HandleFunc("/sink", sink)
	srv := &http.Server{Addr: ":" + port, Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Printf("httpd listening on :%s (addresses %s)", port, podIPs())
	if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
		log.Fatal(err)
	}
}
