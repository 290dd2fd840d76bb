#!/bin/bash
# Per-call instruction counts (callgrind) of a unary call: ours (jmp run + examples/bench_calls)
# against tonic alone (examples/bench_floor), 1,000 and 2,000 calls each; see docs/performance.md.
# Run from a scratch directory holding e.yaml (one MockPower named power), after
# `cargo build --release -p jumpstarter-cli --examples --bins`. Needs valgrind and nc.
R=${R:-$(dirname "$0")/../target/release}
export RUST_BACKTRACE=0 JMP_LOG=warn JMP_GRPC_INSECURE=1 JMP_CLIENT_CONFIG_HOME=${TMPDIR:-/tmp}/callgrind-floor-cfg
cg() { local log=$1; shift; valgrind --tool=callgrind --callgrind-out-file=/dev/null --log-file=$log "$@"; }
got() { grep -o "Collected : [0-9]*" $1 | awk '{print $3}'; }
for N in 1000 2000; do
  P=$((17100+N/1000))
  cg so_$N.log $R/jmp run --exporter-config e.yaml --tls-grpc-listener 127.0.0.1:$P --tls-grpc-insecure > /dev/null 2>&1 &
  for i in $(seq 90); do nc -z 127.0.0.1 $P 2>/dev/null && break; sleep 1; done
  cg co_$N.log $R/examples/bench_calls 127.0.0.1:$P $N 1
  pkill -TERM -f "tls-grpc-listener 127.0.0.1:$P"; wait
  cg sf_$N.log $R/examples/bench_floor serve 2> ferr_$N.txt &
  for i in $(seq 90); do F=$(grep -o "listening on [0-9]*" ferr_$N.txt 2>/dev/null | awk '{print $3}'); [ -n "$F" ] && break; sleep 1; done
  cg cf_$N.log $R/examples/bench_floor call $F $N
  pkill -TERM -f "bench_floor serve"; wait
  echo "N=$N ours client $(got co_$N.log) server $(got so_$N.log) | tonic client $(got cf_$N.log) server $(got sf_$N.log)"
done
