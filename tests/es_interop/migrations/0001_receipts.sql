-- What the esbank test service's receipt step writes (one row per receipt it handled).
CREATE TABLE receipts (
    account_id text   NOT NULL,
    amount     bigint NOT NULL,
    message_id uuid   PRIMARY KEY
);
