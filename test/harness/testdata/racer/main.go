// Command racer is a test-only process for the harness's race check:
// with -race it provokes one data race (unless "calm"), says "ready", and
// runs until SIGTERM.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	if len(os.Args) < 2 || os.Args[1] != "calm" {
		race()
	}
	fmt.Println("ready")
	<-stop
}

// race writes one variable from two goroutines without synchronisation.
func race() {
	var counter int
	done := make(chan struct{})
	go func() {
		counter++
		close(done)
	}()
	counter++
	<-done
	fmt.Println("counter", counter)
}
