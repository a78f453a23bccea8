#!/usr/bin/env bash
# Two hosts on this machine: two network namespaces joined by a veth pair (10.231.0.1 and
# 10.231.0.2, addresses of their own that nothing else uses), each with its own loopback, as two
# machines have. te-encoder runs across them the ways users start it and is held to the same run
# on one host:
#   1. DP2 (a rank per host) and DP2xTP2 (2 hosts x 2 ranks) with torchrun's environment set by
#      hand, and again with te-run --nnodes 2: every step's loss within 1e-6 of one host's;
#   2. a checkpoint saved across the hosts is the same bytes as the one saved on one host, and
#      both load on one process to the same dev metrics;
#   3. a host whose ranks are killed mid-step is named by the survivors within the timeout;
#   4. a rank told to bind its loopback (GLOO_SOCKET_IFNAME=lo) is refused on both hosts at once,
#      naming both ranks, both addresses and the variable.
# The namespaces and their processes are removed on exit, pass or fail. Exit 77 (CTest: skipped)
# where namespaces cannot be made (not root, no iproute2, no CAP_NET_ADMIN).
#
#   bash tests/multihost/two_hosts.sh TE_ENCODER TE_RUN COLA_DIR [WORK_DIR]
set -euo pipefail
enc=$(realpath "$1")
terun=$(realpath "$2")
data=$(realpath "$3")
work=${4:-$(mktemp -d)}/two_hosts
rm -rf "$work"  # a folder of its own, emptied: a log left by an earlier run would mislead
mkdir -p "$work"
cd "$work"

if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
  echo "two_hosts: SKIPPED (needs root and iproute2 to make network namespaces)"
  exit 77
fi
id=$$
h0=te-h0-$id
h1=te-h1-$id
remove_hosts() {  # ID: its namespaces (and their processes) and its veth pair
  local h
  for h in "te-h0-$1" "te-h1-$1"; do
    ip netns pids "$h" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$h" 2>/dev/null || true
  done
  ip link del "tev0-$1" 2>/dev/null || true
  rm -rf "/etc/netns/te-h0-$1" "/etc/netns/te-h1-$1"
}
cleanup() { remove_hosts $id; }
trap cleanup EXIT
# What an earlier run left when it was killed outright (a CTest timeout kills bash with SIGKILL,
# so its trap never ran): the hosts of scripts no longer running.
for stale in $(ip netns list 2>/dev/null | grep -Eo '^te-h[01]-[0-9]+' | sed 's/^te-h[01]-//' |
  sort -u); do
  kill -0 "$stale" 2>/dev/null || remove_hosts "$stale"
done
if ! ip netns add "$h0" 2>/dev/null; then
  echo "two_hosts: SKIPPED (cannot make a network namespace here)"
  exit 77
fi
ip netns add "$h1"
ip link add "tev0-$id" type veth peer name "tev1-$id"
ip link set "tev0-$id" netns "$h0"
ip link set "tev1-$id" netns "$h1"
ip -n "$h0" addr add 10.231.0.1/24 dev "tev0-$id"
ip -n "$h1" addr add 10.231.0.2/24 dev "tev1-$id"
for h in "$h0" "$h1"; do ip -n "$h" link set lo up; done
ip -n "$h0" link set "tev0-$id" up
ip -n "$h1" link set "tev1-$id" up


fail() {
  echo "two_hosts: FAILED: $*"
  exit 1
}

# A small model and a few steps: the point is the exchange, not the training.
model=(--data "$data" --hidden-size 64 --mlp-hidden-size 128 --heads 4 --batch-size 32
  --max-seq-len 32 --epochs 1 --threads 1 --mlp-activations gelu)
dp2=(--mesh data=2 --mesh-resource dp=data)
dp2tp2=(--mesh data=2,model=2 --mesh-resource dp=data,tpsp=model)
export TE_DIST_TIMEOUT_S=30
port=29500
# No command of this script outlives 2 minutes, whatever hangs.
limit=(timeout -k 5 120)
# A refusal "at once" takes a few seconds (measured 2-3 s): far below the timeout.
at_once=10

# On one host: the references.
"${limit[@]}" "$terun" --nproc 2 -- "$enc" "${model[@]}" "${dp2[@]}" --max-steps 6 --log-steps one_dp2.csv \
  >one_dp2.log 2>&1 || fail "DP2 on one host: $(tail -n 5 one_dp2.log)"
"${limit[@]}" "$terun" --nproc 4 -- "$enc" "${model[@]}" "${dp2tp2[@]}" --max-steps 6 \
  --log-steps one_dp2tp2.csv --save one_ckpt >one_dp2tp2.log 2>&1 ||
  fail "DP2xTP2 on one host: $(tail -n 5 one_dp2tp2.log)"

# Ranks started with torchrun's variables set by hand: RANKS_PER_HOST ranks on each host.
torchrun_env() {  # NAME RANKS_PER_HOST ARGS...
  local name=$1 per=$2
  shift 2
  local pids=() h k rank
  for k in 0 1; do
    h=$([ $k -eq 0 ] && echo "$h0" || echo "$h1")
    for ((i = 0; i < per; i++)); do
      rank=$((k * per + i))
      "${limit[@]}" ip netns exec "$h" env RANK=$rank WORLD_SIZE=$((2 * per)) LOCAL_RANK=$i \
        LOCAL_WORLD_SIZE="$per" GROUP_RANK=$k MASTER_ADDR="${MASTER:-10.231.0.1}" MASTER_PORT=$port \
        "$enc" "$@" >"$name.rank$rank.log" 2>&1 &
      pids+=($!)
    done
  done
  local status=0
  for p in "${pids[@]}"; do wait "$p" || status=1; done
  return $status
}

# One te-run per host.
terun_nodes() {  # NAME RANKS_PER_HOST ARGS...
  local name=$1 per=$2
  shift 2
  "${limit[@]}" ip netns exec "$h0" "$terun" --nnodes 2 --node-rank 0 --nproc-per-node "$per" \
    --master-addr 10.231.0.1 --master-port $port -- "$enc" "$@" >"$name.node0.log" 2>&1 &
  local p0=$!
  "${limit[@]}" ip netns exec "$h1" "$terun" --nnodes 2 --node-rank 1 --nproc-per-node "$per" \
    --master-addr 10.231.0.1 --master-port $port -- "$enc" "$@" >"$name.node1.log" 2>&1 &
  local p1=$!
  local s0=0 s1=0
  wait $p0 || s0=$?
  wait $p1 || s1=$?
  echo "$s0" >"$name.node0.status"
  [ $s0 -eq 0 ] && [ $s1 -eq 0 ]
}

# Every step's loss within 1e-6 of one host's.
same_losses() {  # A.csv B.csv
  python3 - "$1" "$2" <<'PY'
import csv, sys
a = [float(r["loss"]) for r in csv.DictReader(open(sys.argv[1]))]
b = [float(r["loss"]) for r in csv.DictReader(open(sys.argv[2]))]
if len(a) != len(b) or not a:
    print(f"{len(a)} steps against {len(b)}")
    sys.exit(1)
worst = max(abs(x - y) for x, y in zip(a, b))
print(f"{len(a)} steps, largest loss difference {worst:.3g}")
sys.exit(0 if worst <= 1e-6 else 1)
PY
}

torchrun_env torchrun_dp2 1 "${model[@]}" "${dp2[@]}" --max-steps 6 --log-steps torchrun_dp2.csv ||
  fail "DP2 across hosts (torchrun's environment): $(tail -n 3 torchrun_dp2.rank*.log)"
grep -q "launch: torchrun environment: rank 0 of 2, local rank 0 of 1 on node 0 of 2" \
  torchrun_dp2.rank0.log || fail "rank 0 did not say which launcher it read: $(cat torchrun_dp2.rank0.log)"
grep -q "Gloo binds 10.231.0.1 (chosen by the route to MASTER_ADDR=10.231.0.1)" \
  torchrun_dp2.rank0.log || fail "rank 0 did not bind its veth address: $(cat torchrun_dp2.rank0.log)"
out=$(same_losses one_dp2.csv torchrun_dp2.csv) || fail "DP2 across hosts (torchrun's environment) differs from one host: $out"
echo "DP2 across hosts, torchrun's environment: $out"

# The master given by a host name that is a loopback address on its own host (as a stock Debian
# host resolves its own name, 127.0.1.1) and 10.231.0.1 on the other: `ip netns exec` reads each
# host's /etc/netns/NAME/hosts as /etc/hosts. Rank 0 takes its route to rank 1 instead.
mkdir -p "/etc/netns/$h0" "/etc/netns/$h1"
printf '127.0.0.1 localhost\n127.0.1.1 te-master\n' >"/etc/netns/$h0/hosts"
printf '127.0.0.1 localhost\n10.231.0.1 te-master\n' >"/etc/netns/$h1/hosts"
MASTER=te-master torchrun_env named_dp2 1 "${model[@]}" "${dp2[@]}" --max-steps 6 \
  --log-steps named_dp2.csv || fail "DP2 with a master host name: $(tail -n 3 named_dp2.rank*.log)"
grep -qF "Gloo binds 10.231.0.1 (chosen by the route to rank 1's address 10.231.0.2 (MASTER_ADDR=te-master is a loopback address on this host))" \
  named_dp2.rank0.log || fail "rank 0 did not take its route to rank 1: $(cat named_dp2.rank0.log)"
out=$(same_losses one_dp2.csv named_dp2.csv) || fail "DP2 with a master host name differs: $out"
echo "DP2 across hosts, MASTER_ADDR a name that is rank 0's loopback: $out"

torchrun_env torchrun_dp2tp2 2 "${model[@]}" "${dp2tp2[@]}" --max-steps 6 \
  --log-steps torchrun_dp2tp2.csv ||
  fail "DP2xTP2 across hosts (torchrun's environment): $(tail -n 3 torchrun_dp2tp2.rank*.log)"
out=$(same_losses one_dp2tp2.csv torchrun_dp2tp2.csv) || fail "DP2xTP2 across hosts (torchrun's environment) differs from one host: $out"
echo "DP2xTP2 across hosts, torchrun's environment: $out"

terun_nodes terun_dp2 1 "${model[@]}" "${dp2[@]}" --max-steps 6 --log-steps terun_dp2.csv ||
  fail "DP2 across hosts (te-run --nnodes 2): $(tail -n 3 terun_dp2.node*.log)"
out=$(same_losses one_dp2.csv terun_dp2.csv) || fail "DP2 across hosts (te-run --nnodes 2) differs from one host: $out"
echo "DP2 across hosts, te-run --nnodes 2: $out"

terun_nodes terun_dp2tp2 2 "${model[@]}" "${dp2tp2[@]}" --max-steps 6 \
  --log-steps terun_dp2tp2.csv --save hosts_ckpt ||
  fail "DP2xTP2 across hosts (te-run --nnodes 2): $(tail -n 3 terun_dp2tp2.node*.log)"
out=$(same_losses one_dp2tp2.csv terun_dp2tp2.csv) || fail "DP2xTP2 across hosts (te-run --nnodes 2) differs from one host: $out"
echo "DP2xTP2 across hosts, te-run --nnodes 2: $out"

# The checkpoint written by ranks on two hosts: the bytes one host wrote, and it loads alike.
diff -r one_ckpt hosts_ckpt >/dev/null || fail "the checkpoint saved across hosts differs from one host's"
for c in one_ckpt hosts_ckpt; do
  "${limit[@]}" "$enc" "${model[@]}" --load "$c" --eval-only >"load_$c.log" 2>&1 ||
    fail "loading $c on one process: $(tail -n 3 "load_$c.log")"
done
grep "^eval:" load_hosts_ckpt.log >/dev/null || fail "no eval line: $(cat load_hosts_ckpt.log)"
[ "$(grep '^eval:' load_one_ckpt.log)" = "$(grep '^eval:' load_hosts_ckpt.log)" ] ||
  fail "the two checkpoints evaluate differently"
echo "checkpoint saved across hosts: same bytes as one host's; loads on one process to" \
  "$(grep '^eval:' load_hosts_ckpt.log)"

# Host 1's ranks killed mid-training: host 0's name them within the timeout.
terun_nodes killed 2 "${model[@]}" "${dp2tp2[@]}" --max-steps 100000 >/dev/null 2>&1 &
run=$!
# Training has begun when rank 0 prints its first progress line (about a tenth of an epoch).
for _ in $(seq 1200); do
  grep -q "\] *epoch 1 step" killed.node0.log 2>/dev/null && break
  sleep 0.1
done
grep -q "\] *epoch 1 step" killed.node0.log || fail "no training step within 2 minutes: $(tail -n 5 killed.node0.log)"
killed_at=$SECONDS
ip netns pids "$h1" | xargs -r kill -9
wait $run || true
took=$((SECONDS - killed_at))
[ "$(cat killed.node0.status)" != 0 ] || fail "host 0's ranks exited 0 after host 1 was killed"
[ $took -le "$TE_DIST_TIMEOUT_S" ] || fail "the survivors took $took s (timeout $TE_DIST_TIMEOUT_S s)"
grep -Eq "rank [23] (stopped responding|left)" killed.node0.log ||
  fail "the survivors did not name host 1's ranks: $(tail -n 5 killed.node0.log)"
echo "host 1 killed mid-training: host 0's ranks named it after $took s:" \
  "$(grep -Eo 'missing rank [0-9]+ [a-z ]+' killed.node0.log | head -1)"

# Rank 0 on host 0 and rank 1 on host 1 binding what GLOO_SOCKET_IFNAME names there: both must
# fail, at once, each naming WANT.
refused() {  # NAME GLOO_SOCKET_IFNAME_OF_RANK_1 WANT
  local name=$1 ifname=$2 want=$3 start=$SECONDS r
  "${limit[@]}" ip netns exec "$h0" env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=10.231.0.1 \
    MASTER_PORT=$port "$enc" "${model[@]}" "${dp2[@]}" --max-steps 2 >"$name.rank0.log" 2>&1 &
  local p0=$!
  "${limit[@]}" ip netns exec "$h1" env RANK=1 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=10.231.0.1 \
    MASTER_PORT=$port GLOO_SOCKET_IFNAME="$ifname" "$enc" "${model[@]}" "${dp2[@]}" --max-steps 2 \
    >"$name.rank1.log" 2>&1 &
  local p1=$!
  wait $p0 && fail "$name: rank 0 joined"
  wait $p1 && fail "$name: rank 1 joined"
  took=$((SECONDS - start))
  [ $took -le $at_once ] || fail "$name: refusing took $took s"
  for r in 0 1; do
    grep -qF "$want" "$name.rank$r.log" || fail "$name: rank $r did not say '$want': $(cat "$name.rank$r.log")"
  done
}

# Rank 1 binds its loopback.
refused loop lo "rank 1 (host $(hostname)) would advertise its loopback address 127.0.0.1 (chosen by GLOO_SOCKET_IFNAME=lo) to rank 0 on another host ($(hostname), address 10.231.0.1)"
echo "a rank binding its loopback: refused on both hosts after $took s"

# Rank 1 binds an address of its host that host 0 has no route to.
ip -n "$h1" addr add 10.231.9.2/32 dev lo
refused unreached 10.231.9.2 "rank 0 (address 10.231.0.1, chosen by the route to MASTER_ADDR=10.231.0.1) cannot reach rank 1's address 10.231.9.2:"
grep -qF "chosen by GLOO_SOCKET_IFNAME=10.231.9.2" unreached.rank1.log ||
  fail "rank 1 did not name what chose the address: $(cat unreached.rank1.log)"
echo "a rank binding an address the other host cannot reach: refused on both hosts after $took s"
echo "two_hosts: PASSED"
