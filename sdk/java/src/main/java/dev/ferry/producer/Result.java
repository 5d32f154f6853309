package dev.ferry.producer;

import java.util.Collections;
import java.util.List;

/**
 * A record's fate: successful (durable where the agent's delivery mode says), or the last error; with every attempt.
 * With {@link ProducerConfig#setReceipts receipts} (protocol version 2), a successful record's receipt: where it is
 * in Kafka ({@link #getTopic}, {@link #getPartition}, {@link #getOffset}), or, when the agent's spool took it before
 * Kafka had it, the {@link #getReceiptId receipt id} to look up with GET /receipts/{id} on the agent's HTTP listener.
 */
public final class Result {
    private final boolean successful;
    private final List<Attempt> attempts;
    private final String topic, receiptId;
    private final int partition;
    private final long offset;

    Result(boolean successful, List<Attempt> attempts) {
        this(successful, attempts, "", -1, -1, "");
    }

    Result(boolean successful, List<Attempt> attempts, String topic, int partition, long offset, String receiptId) {
        this.successful = successful;
        this.attempts = Collections.unmodifiableList(attempts);
        this.topic = topic;
        this.partition = partition;
        this.offset = offset;
        this.receiptId = receiptId;
    }

    /** The Kafka topic the record is in ("" when not known). */
    public String getTopic() { return topic; }

    /** The Kafka partition the record is in (-1 when not known). */
    public int getPartition() { return partition; }

    /** The record's offset in its partition: -1 when not known (no receipts asked, failed, or only in the agent's spool so far). */
    public long getOffset() { return offset; }

    /** The agent's spool receipt id, when it answered from its spool before Kafka had the record ("" otherwise). */
    public String getReceiptId() { return receiptId; }

    public boolean isSuccessful() { return successful; }

    /** Every attempt, in order; the last one decided. */
    public List<Attempt> getAttempts() { return attempts; }

    /** The last attempt's error code ("" on success). */
    public String getErrorCode() { return attempts.isEmpty() ? "" : attempts.get(attempts.size() - 1).getErrorCode(); }

    public String getErrorMessage() { return attempts.isEmpty() ? "" : attempts.get(attempts.size() - 1).getErrorMessage(); }

    @Override
    public String toString() {
        return "Result{successful=" + successful + (offset >= 0 ? ", at=" + topic + "/" + partition + "/" + offset : "")
                + (receiptId.isEmpty() ? "" : ", receiptId=" + receiptId) + ", attempts=" + attempts + "}";
    }
}
