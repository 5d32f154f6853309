package dev.ferry.producer;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.nio.charset.StandardCharsets;

import org.junit.jupiter.api.Test;

class LogItemTest {
    @Test
    void jsonKeepsOrderEscapesAndUtf8() {
        LogItem it = new LogItem().pushBack("z", "last? no, first").pushBack("a", "quote \" back\\slash\nnew\u0001").pushBack("中", "测试日志");
        String json = new String(it.toJson(), StandardCharsets.UTF_8);
        assertEquals("{\"z\":\"last? no, first\",\"a\":\"quote \\\" back\\\\slash\\nnew\\u0001\",\"中\":\"测试日志\"}", json);
    }

    @Test
    void sizeIsCountedInUtf8Bytes() {
        byte[] b = new LogItem().pushBack("k", "测").toJson();
        assertEquals("{\"k\":\"\"}".length() + 3, b.length);
    }
}
