package dev.sluice.example.orders;

import java.util.concurrent.ThreadLocalRandom;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.http.ResponseEntity;
import org.springframework.web.bind.annotation.GetMapping;
import org.springframework.web.bind.annotation.PathVariable;
import org.springframework.web.bind.annotation.RestController;

/** The API: one endpoint whose "work" is a sleep of {@code orders.work-ms} (20 ms). */
@RestController
public class OrderController {
    private final long workMillis;

    public OrderController(@Value("${orders.work-ms:20}") long workMillis) {
        this.workMillis = workMillis;
    }

    @GetMapping("/orders/{id}")
    public ResponseEntity<Order> order(@PathVariable("id") long id) throws InterruptedException {
        Thread.sleep(workMillis); // the queries and the business logic of a real endpoint
        int items = 1 + (int) (id % 5);
        return ResponseEntity.ok(new Order(id, "SHIPPED", items,
                items * 1999L + ThreadLocalRandom.current().nextInt(100)));
    }
}
