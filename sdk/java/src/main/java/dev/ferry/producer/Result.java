package dev.ferry.producer;

import java.util.Collections;
import java.util.List;

/** A record's fate: successful (durable where the agent's delivery mode says), or the last error; with every attempt. */
public final class Result {
    private final boolean successful;
    private final List<Attempt> attempts;

    Result(boolean successful, List<Attempt> attempts) {
        this.successful = successful;
        this.attempts = Collections.unmodifiableList(attempts);
    }

    public boolean isSuccessful() { return successful; }

    /** Every attempt, in order; the last one decided. */
    public List<Attempt> getAttempts() { return attempts; }

    /** The last attempt's error code ("" on success). */
    public String getErrorCode() { return attempts.isEmpty() ? "" : attempts.get(attempts.size() - 1).getErrorCode(); }

    public String getErrorMessage() { return attempts.isEmpty() ? "" : attempts.get(attempts.size() - 1).getErrorMessage(); }

    @Override
    public String toString() {
        return "Result{successful=" + successful + ", attempts=" + attempts + "}";
    }
}
