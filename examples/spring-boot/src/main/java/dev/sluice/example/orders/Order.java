package dev.sluice.example.orders;

/** What GET /orders/{id} answers. */
public record Order(long id, String status, int items, long totalCents) {}
