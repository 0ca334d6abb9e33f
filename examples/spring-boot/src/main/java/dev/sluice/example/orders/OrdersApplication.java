package dev.sluice.example.orders;

import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;

/**
 * The orders service of the example. {@code logging.mode} (env {@code LOGGING_MODE}) picks how
 * {@link RequestLogAspect} logs each request: {@code none}, {@code sync-jdbc} or {@code sluice};
 * {@code application.properties} also picks the logback file of that name.
 */
@SpringBootApplication
public class OrdersApplication {
    public static void main(String[] args) {
        SpringApplication.run(OrdersApplication.class, args);
    }
}
