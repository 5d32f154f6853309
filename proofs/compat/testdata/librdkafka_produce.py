"""Produce with librdkafka (confluent-kafka), unmodified, and report.

usage: librdkafka_produce.py BOOTSTRAP TOPIC N COMPRESSION
Sends N records, key "key-(i%23)", value "value-i", headers app=python and
seq=i, idempotent with acks=all, and prints one JSON line: how many were
delivered, failures, and the partition librdkafka's own partitioner chose
for each key (from the delivery reports).
"""
import json
import sys

from confluent_kafka import Producer

bootstrap, topic, n, compression = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
p = Producer({
    "bootstrap.servers": bootstrap,
    "enable.idempotence": True,
    "acks": "all",
    "compression.type": compression,
    "linger.ms": 5,
})
delivered, failed, parts = 0, [], {}


def report(err, msg):
    global delivered
    if err is not None:
        failed.append(str(err))
        return
    delivered += 1
    parts[msg.key().decode()] = msg.partition()


for i in range(n):
    while True:
        try:
            p.produce(topic, key=f"key-{i % 23}", value=f"value-{i}",
                      headers=[("app", b"python"), ("seq", str(i).encode())], on_delivery=report)
            break
        except BufferError:
            p.poll(0.1)
    p.poll(0)
left = p.flush(60)
print(json.dumps({"delivered": delivered, "failed": failed[:5], "left": left, "partitions": parts}))
