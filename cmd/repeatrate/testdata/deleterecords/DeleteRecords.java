import java.util.HashMap;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.common.TopicPartition;

/**
 * Deletes a topic's records below the given offsets, as Kafka's retention would once they are old
 * enough: java -cp '.cache/kafka/libs/*' DeleteRecords.java BOOTSTRAP TOPIC PARTITION=OFFSET...
 * (kafka-go has no DeleteRecords request; the tests that need a topic to have lost its start use
 * the broker's own admin client.)
 */
public class DeleteRecords {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        Map<TopicPartition, RecordsToDelete> below = new HashMap<>();
        for (int i = 2; i < args.length; i++) {
            String[] kv = args[i].split("=");
            below.put(new TopicPartition(args[1], Integer.parseInt(kv[0])), RecordsToDelete.beforeOffset(Long.parseLong(kv[1])));
        }
        try (Admin admin = Admin.create(props)) {
            admin.deleteRecords(below).all().get();
        }
    }
}
