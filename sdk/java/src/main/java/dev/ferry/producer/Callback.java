package dev.ferry.producer;

/** Called once per record, when it is durable or has failed for good. */
@FunctionalInterface
public interface Callback {
    void onCompletion(Result result);
}
