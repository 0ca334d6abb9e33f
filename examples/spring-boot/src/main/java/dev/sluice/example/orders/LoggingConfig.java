package dev.sluice.example.orders;

import org.springframework.beans.factory.annotation.Value;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;

@Configuration
public class LoggingConfig {
    @Bean
    LoggingMode loggingMode(@Value("${logging.mode:none}") String mode) {
        return LoggingMode.parse(mode);
    }
}
