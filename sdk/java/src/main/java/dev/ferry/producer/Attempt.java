package dev.ferry.producer;

/** One attempt to deliver a record: when, and how the agent answered. */
public final class Attempt {
    private final boolean success;
    private final String errorCode;
    private final String errorMessage;
    private final long timestampMs;

    Attempt(boolean success, String errorCode, String errorMessage, long timestampMs) {
        this.success = success;
        this.errorCode = errorCode;
        this.errorMessage = errorMessage;
        this.timestampMs = timestampMs;
    }

    public boolean isSuccess() { return success; }

    /** The agent's reason (queue_full, record_too_large, ...), or the client's (closed, buffer_full, connection_lost); "" on success. */
    public String getErrorCode() { return errorCode; }

    public String getErrorMessage() { return errorMessage; }

    public long getTimestampMs() { return timestampMs; }

    @Override
    public String toString() {
        return success ? "Attempt{success at " + timestampMs + "}" : "Attempt{" + errorCode + ": " + errorMessage + " at " + timestampMs + "}";
    }
}
