// Reads one JSON query per line from stdin, {"spec", "zone", "start" (Unix seconds),
// "count"}, and prints the next `count` fire times after `start` as a JSON list of Unix
// seconds, 0 ending the list when robfig finds none. The schedule is parsed the way
// the CronJob controller does it: "TZ=<zone> <spec>" through cron.ParseStandard.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/robfig/cron/v3"
)

type query struct {
	Spec  string `json:"spec"`
	Zone  string `json:"zone"`
	Start int64  `json:"start"`
	Count int    `json:"count"`
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for in.Scan() {
		var q query
		if err := json.Unmarshal(in.Bytes(), &q); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		schedule, err := cron.ParseStandard("TZ=" + q.Zone + " " + q.Spec)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%q: %v\n", q.Spec, err)
			os.Exit(2)
		}
		times := []int64{}
		t := time.Unix(q.Start, 0).UTC()
		for i := 0; i < q.Count; i++ {
			t = schedule.Next(t)
			if t.IsZero() {
				times = append(times, 0)
				break
			}
			times = append(times, t.Unix())
		}
		line, _ := json.Marshal(times)
		out.Write(line)
		out.WriteString("\n")
	}
}
