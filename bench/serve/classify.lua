-- wrk script for te-serve: POSTs one sentence per request, cycling through the bodies in
-- TE_BODIES (one JSON body per line), and prints a JSON summary line at the end.
local bodies = {}
local counter = 0

function init(args)
  local path = os.getenv("TE_BODIES")
  for line in io.lines(path) do bodies[#bodies + 1] = line end
end

function request()
  counter = counter + 1
  local body = bodies[(counter % #bodies) + 1]
  return wrk.format("POST", "/v1/classify", {["Content-Type"] = "application/json"}, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'TE_SUMMARY {"requests": %d, "seconds": %.3f, "rps": %.1f, "p50_ms": %.2f, "p99_ms": %.2f, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}}\n',
    summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    e.connect, e.read, e.write, e.status, e.timeout))
end
