"""Writes bench/sample.jsonl: 1,000 JSON log lines shaped like a web service's (access logs,
business events, slow-query warnings, errors with stack traces, debug lines), from a fixed seed
so the committed file can be re-made byte for byte. `scripts/bench` draws records from it.

    python3 scripts/bench-sample.py > bench/sample.jsonl
"""

import json
import random

rng = random.Random(20261130)
PATHS = ["/api/v1/orders", "/api/v1/orders/{id}", "/api/v1/users/{id}", "/api/v1/cart", "/healthz",
         "/api/v1/search", "/api/v1/payments", "/static/app.js", "/api/v1/inventory/{id}"]
AGENTS = ["Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Safari/537.36",
          "okhttp/4.12.0", "python-requests/2.32.3", "kube-probe/1.31", "curl/8.5.0"]
SERVICES = ["checkout", "orders", "users", "search", "payments"]
WORDS = ("order user cart item payment retry cache miss hit timeout upstream token session refresh "
         "queue worker shard replica lock commit rollback index scan").split()


def hexid(n):
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


def timestamp(i):
    return f"2026-11-30T10:{(i // 60) % 60:02d}:{i % 60:02d}.{rng.randrange(1000000):06d}Z"


def access(i):
    path = rng.choice(PATHS).replace("{id}", str(rng.randrange(1, 10**6)))
    status = rng.choices([200, 201, 204, 304, 400, 404, 500, 503], [70, 8, 5, 5, 4, 5, 2, 1])[0]
    return {"@timestamp": timestamp(i), "level": "info", "logger": "http.access", "msg": "request completed",
            "method": rng.choice(["GET", "GET", "GET", "POST", "PUT", "DELETE"]), "path": path, "status": status,
            "duration_ms": round(rng.lognormvariate(3, 1), 3), "bytes_out": rng.randrange(80, 60000),
            "remote_addr": f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(256)}",
            "user_agent": rng.choice(AGENTS), "trace_id": hexid(32), "span_id": hexid(16)}


def event(i):
    return {"@timestamp": timestamp(i), "level": "info", "logger": f"{rng.choice(SERVICES)}.service",
            "msg": f"{rng.choice(WORDS)} {rng.choice(WORDS)} processed",
            "order_id": f"ord_{hexid(12)}", "user_id": rng.randrange(1, 10**7),
            "items": [{"sku": f"SKU-{rng.randrange(10**5):05d}", "qty": rng.randrange(1, 5),
                       "price": round(rng.uniform(1, 300), 2)} for _ in range(rng.randrange(1, 5))],
            "trace_id": hexid(32)}


def slow_query(i):
    return {"@timestamp": timestamp(i), "level": "warn", "logger": "db.pool", "msg": "slow query",
            "duration_ms": round(rng.uniform(200, 4000), 1), "rows": rng.randrange(0, 5000),
            "query": "SELECT o.id, o.status, o.total FROM orders o JOIN users u ON u.id = o.user_id "
                     f"WHERE u.id = $1 AND o.created_at > now() - interval '{rng.randrange(1, 90)} days' "
                     "ORDER BY o.created_at DESC LIMIT 50", "trace_id": hexid(32)}


def error(i):
    frames = [f"  at com.example.{rng.choice(SERVICES)}.{rng.choice(WORDS).title()}Handler."
              f"{rng.choice(WORDS)}({rng.choice(WORDS).title()}.java:{rng.randrange(20, 900)})"
              for _ in range(rng.randrange(6, 20))]
    return {"@timestamp": timestamp(i), "level": "error", "logger": f"{rng.choice(SERVICES)}.service",
            "msg": "upstream call failed", "error": {"type": "java.net.SocketTimeoutException",
                                                     "message": "Read timed out after 2000 ms",
                                                     "stack": "\n".join(frames)},
            "upstream": f"http://{rng.choice(SERVICES)}.svc.cluster.local:8080", "attempt": rng.randrange(1, 4),
            "trace_id": hexid(32)}


def debug(i):
    return {"ts": 1764496800 + i, "lvl": "debug", "msg": f"{rng.choice(WORDS)} {rng.choice(WORDS)}",
            "cache": rng.choice(["hit", "miss"]), "key": f"user:{rng.randrange(10**6)}"}


KINDS = [(access, 55), (event, 20), (debug, 15), (slow_query, 6), (error, 4)]
for i in range(1000):
    kind = rng.choices([k for k, _ in KINDS], [w for _, w in KINDS])[0]
    print(json.dumps(kind(i), separators=(",", ":")))
